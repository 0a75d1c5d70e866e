"""The decode block tables of a step's attention metadata (engine/step_meta.py)."""

from __future__ import annotations

import gc
import random

import torch

from engine.block_manager import OUT_OF_WINDOW
from engine.step_meta import pad_table, padded_tables


def test_padded_tables_match_pad_table_row_by_row():
    rng = random.Random(0)

    def entry() -> int:
        return OUT_OF_WINDOW if rng.random() < 0.2 else rng.randrange(1 << 40)

    cases = []
    for _ in range(50):
        n = rng.randint(1, 40)
        tables = [[entry() for _ in range(rng.randint(0, 50))] for _ in range(rng.randint(1, 70))]
        cases.append((padded_tables(tables, n), torch.tensor([pad_table(t, n) for t in tables])))
    gc.collect()  # each tensor keeps its buffer alive
    for got, want in cases:
        assert got.dtype == torch.int64 and got.is_contiguous()
        assert torch.equal(got, want)


def test_released_and_missing_blocks_read_as_block_zero():
    got = padded_tables([[OUT_OF_WINDOW, 7, 9], [5]], 4)
    assert got.tolist() == [[0, 7, 9, 0], [5, 0, 0, 0]]
