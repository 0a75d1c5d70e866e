"""The machine's memory read bandwidth, the denominator of every memory-bandwidth bound.

`csrc/stream_read.c` streams a buffer far larger than the last-level cache through vector loads on
every thread (OpenMP), as a batch-1 decode step streams its weights; the best of several passes
counts. Without a C compiler `torch.sum` over the same buffer stands in (it reaches less: its
reduction is compute-heavier than a read, so a bound from it is too low).
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import torch

from engine import native

SOURCE = Path(__file__).parent / "csrc" / "stream_read.c"
LINE = 64  # bytes a cache line; the kernel reads 4 lines an iteration


def _library() -> ctypes.CDLL | None:
    lib = native.library(SOURCE, {"stream_read": [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]})
    if lib is not None:
        lib.stream_read.restype = ctypes.c_uint64
    return lib


def read_bandwidth(threads: int, gib: float = 1.0, repeats: int = 7) -> float:
    """Bytes per second read from a `gib` GiB buffer: the best of `repeats` passes with each thread
    count up to `threads` (one core of a VM may already reach the memory's share of the host)."""
    before = torch.get_num_threads()
    try:
        return max(_read_bandwidth(t, gib, repeats) for t in range(1, threads + 1))
    finally:
        torch.set_num_threads(before)


def _read_bandwidth(threads: int, gib: float, repeats: int) -> float:
    torch.set_num_threads(threads)
    lines = int(gib * 2**30) // (4 * LINE) * 4
    buf = torch.ones(lines * LINE // 4, dtype=torch.float32)  # written once: every page is mapped
    lib = _library()
    if lib is not None and buf.data_ptr() % LINE == 0:
        read = lambda: lib.stream_read(buf.data_ptr(), lines, threads)  # noqa: E731
    else:
        read = buf.sum
    read()
    best = min(_timed(read) for _ in range(repeats))
    return lines * LINE / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
