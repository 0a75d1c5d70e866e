"""The Triton SGMV launches, recorded without running them (engine/kernels/variants.py): the
shrink's split-K grid at decode shapes of an 8B model, and no compiled variant added by what
changes from step to step (segment count, rows, the step's ranks)."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from engine.kernels.variants import VariantLog  # noqa: E402
from engine.lora.kernels.base import Segment  # noqa: E402
from engine.lora.kernels.triton_sgmv import TritonSGMV, _shrink  # noqa: E402

H100_SMS = 132
RANK = 16  # the slots' max rank


def _launch(log: VariantLog, segments: list[Segment], in_f: int, out_f: int, m: int) -> tuple:
    """Apply the Triton kernel (recorded, not run) to segments of fp32 slots; the shrink's
    (grid, {argument: value})."""
    lora, rows = TritonSGMV(), max(s.end for s in segments)
    a = torch.empty(4, RANK, m, in_f)
    b = torch.empty(4, RANK, m, out_f)
    x, y = torch.empty(rows, in_f, dtype=torch.bfloat16), torch.empty(rows, m * out_f, dtype=torch.bfloat16)
    lora.apply(y, x, a, b, lora.prepare(segments, torch.device("cpu")))
    grid, args, kwargs = log.last["_shrink"]
    return grid, {**dict(zip(_shrink.arg_names, args)), **kwargs}


@pytest.mark.parametrize("in_f", [4096, 8192, 14336])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("adapters, rows", [(1, 1), (1, 8), (4, 2), (16, 1)])
def test_decode_shrink_splits_k_over_several_programs_a_segment(in_f, m, adapters, rows):
    log = VariantLog(execute=False)
    try:
        segments = [Segment(i * rows, (i + 1) * rows, i % 4, RANK) for i in range(adapters)]
        grid, arg = _launch(log, segments, in_f, 4096, m)
    finally:
        log.close()
    tiles = adapters * -(-rows // arg["BLOCK_M"]) * -(-RANK * m // arg["BLOCK_N"])  # row x column tiles
    splits = grid[0] * grid[1] * grid[2] // tiles  # programs a tile
    assert splits > 1, grid  # each row x column tile of a segment is reduced by several programs
    assert grid == (splits * arg["NCB"], -(-rows // arg["BLOCK_M"]), adapters)
    assert (splits - 1) * arg["CHUNK"] < in_f <= splits * arg["CHUNK"]  # the chunks cover K once
    assert arg["CHUNK"] % arg["BLOCK_K"] == 0
    if in_f == 14336:  # an 8B's down projection: the decode shrink fills an H100
        assert grid[0] * grid[1] * grid[2] >= H100_SMS, grid


def test_prefill_shrink_keeps_k_whole_when_row_tiles_fill_the_gpu():
    log = VariantLog(execute=False)
    try:
        grid, arg = _launch(log, [Segment(0, 8192, 0, RANK)], 4096, 4096, 1)
    finally:
        log.close()
    assert grid[0] == arg["NCB"] == 1 and arg["CHUNK"] >= 4096


def test_per_step_segments_rows_and_ranks_add_no_variant():
    rng = random.Random(0)
    for in_f, out_f, m in [(4096, 4096, 3), (14336, 4096, 1), (576, 192, 3)]:
        log = VariantLog(execute=False)
        try:
            for _ in range(40):
                segments, start = [], rng.randrange(3)  # leading rows without adapter
                for _ in range(rng.randrange(1, 12)):
                    n = rng.choice([1, 1, 2, 3, 17, 70])
                    segments.append(Segment(start, start + n, rng.randrange(4), rng.choice([1, 3, 8, 16])))
                    start += n + rng.choice([0, 0, 1])  # rows of no adapter between segments
                _launch(log, segments, in_f, out_f, m)
            assert log.launches["_shrink"] == log.launches["_expand"] == 40
            assert log.counts() == {"_shrink": 1, "_expand": 1}, (in_f, m)
        finally:
            log.close()
