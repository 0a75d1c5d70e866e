"""The FMA kernel behind every compute floor runs the chains it counts: its sum of each chain's
first lane equals the same recurrence in numpy (acc = acc * w + x, `iters` times, from the chain's
index), with one thread and with two; and the rate it gives is a rate."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from benchmarks import fma_rate


@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_runs_every_chain_for_every_step(threads):
    fma_rate.fma_rate(1, iters=10, repeats=1)  # loads the library and sets its types
    lib = fma_rate.native.library(fma_rate.SOURCE, {})
    assert lib is not None, "the kernel needs a C compiler (gcc), which CI has"
    iters, sink = 1000, ctypes.c_float()
    lanes = lib.fma_rate(iters, threads, ctypes.byref(sink))
    assert lanes in (1, 8, 16)
    acc = np.arange(fma_rate.CHAINS, dtype=np.float64)
    w, x = np.float64(np.float32(0.999999)), np.float64(np.float32(1e-7))
    for _ in range(iters):
        acc = (acc * w + x).astype(np.float32).astype(np.float64)  # one rounding a step, as an FMA
    assert sink.value == pytest.approx(threads * acc.sum(), rel=1e-5)
    lib.fma_rate(iters + 100, threads, ctypes.byref(sink))  # more steps: a different sum
    assert sink.value != pytest.approx(threads * acc.sum(), rel=1e-6)


def test_fma_rate_is_a_rate():
    gflops = fma_rate.fma_rate(1, iters=100_000, repeats=2) / 1e9
    assert 0.1 < gflops < 100_000
