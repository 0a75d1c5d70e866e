"""The machine's fp32 multiply-add rate, the denominator of a compute floor (a step's FLOPs over it),
beside benchmarks/bandwidth.py's read bandwidth (the bytes' floor): at large batches a MoE step's
expert products cost more time at this rate than its weights take to read.

`csrc/fma_rate.c` runs independent FMA chains over the widest vectors the build has on every
thread; the best of several passes counts. At one thread a pass is timed in the thread's CPU time
(the pass runs on the calling thread), which a shared host's other jobs do not stretch; at more,
in wall time. None without a C compiler.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

from engine import native

SOURCE = Path(__file__).parent / "csrc" / "fma_rate.c"
CHAINS = 16  # csrc/fma_rate.c's chains a thread


def fma_rate(threads: int, iters: int = 2_000_000, repeats: int = 20) -> float | None:
    """fp32 FLOP/s (a multiply-add is 2) of `threads` threads: the best of `repeats` passes."""
    lib = native.library(SOURCE, {})
    if lib is None:
        return None
    fn = lib.fma_rate
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_long, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    sink = ctypes.c_float()
    fn(iters // 10, threads, ctypes.byref(sink))  # warm-up: threads started, clocks up
    clock = time.thread_time if threads == 1 else time.perf_counter
    best, lanes = float("inf"), 1
    for _ in range(repeats):
        t = clock()
        lanes = fn(iters, threads, ctypes.byref(sink))
        best = min(best, clock() - t)
    return 2 * lanes * CHAINS * iters * threads / best
