"""The read kernel behind every memory-bandwidth bound reads the whole buffer: its XOR of all the
8-byte words equals numpy's, with one thread and with two, on every vector width the machine has."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks import bandwidth


@pytest.mark.parametrize("threads", [1, 2])
def test_stream_read_reads_every_word(threads):
    lib = bandwidth._library()
    assert lib is not None, "the kernel needs a C compiler (gcc), which CI has"
    lines = 4 * 5000  # several of the kernel's 4096-line chunks, and a partial one
    words = torch.empty(lines * 8, dtype=torch.int64)  # torch aligns to 64 bytes
    words.copy_(torch.from_numpy(np.random.default_rng(0).integers(0, 2**63, lines * 8, dtype=np.int64)))
    assert words.data_ptr() % bandwidth.LINE == 0
    expected = int(np.bitwise_xor.reduce(words.numpy()).view(np.uint64))
    assert lib.stream_read(words.data_ptr(), lines, threads) == expected
    words[-1] ^= 1  # the last word counts too
    assert lib.stream_read(words.data_ptr(), lines, threads) == expected ^ 1


def test_read_bandwidth_is_a_rate():
    before = torch.get_num_threads()
    gbs = bandwidth.read_bandwidth(2, gib=0.0625, repeats=2) / 1e9
    assert 0.1 < gbs < 10_000
    assert torch.get_num_threads() == before
