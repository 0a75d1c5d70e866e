"""A step's attention metadata (engine/step_meta.py) over the block tables kept on the device."""

from __future__ import annotations

import random

import torch

from engine.block_manager import BlockManager
from engine.block_tables import DeviceBlockTables
from engine.request import SamplingParams, Sequence
from engine.step_meta import attention_meta


def test_decode_rows_and_prefill_chunks_read_their_own_tables_and_slots():
    rng = random.Random(0)
    bs = 4
    bm = BlockManager(400, bs, enable_prefix_caching=False)
    tables = DeviceBlockTables(2, torch.device("cpu"), rows=1)
    tables.follow(bm)
    seqs = [Sequence(str(i), [1] * rng.randint(1, 60), 0, SamplingParams()) for i in range(9)]
    for s in seqs:
        bm.allocate(s, [], s.num_tokens)
    rows = [(s, rng.randrange(s.num_tokens)) for s in seqs[:5]]
    starts = [rng.randrange(s.num_tokens) for s in seqs[5:]]
    chunks = [(s, a, rng.randint(1, s.num_tokens - a)) for s, a in zip(seqs[5:], starts)]
    meta = attention_meta(bs, rows, chunks, tables)

    def slot(s: Sequence, p: int) -> int:
        return s.block_table[p // bs] * bs + p % bs

    want = [slot(s, q) for s, q in rows] + [slot(s, p) for s, a, n in chunks for p in range(a, a + n)]
    assert meta.slot_mapping.tolist() == want
    assert meta.decode_context_lens is not None and meta.decode_block_tables is not None
    assert meta.decode_context_lens.tolist() == [q + 1 for _, q in rows]
    for (s, q), got in zip(rows, meta.decode_block_tables):
        nb = q // bs + 1
        assert got[:nb].tolist() == s.block_table[:nb]
    assert meta.prefill_block_tables is not None
    for i, ((s, a, n), chunk) in enumerate(zip(chunks, meta.prefills)):
        nb = -(-(a + n) // bs)
        assert chunk.block_ids.tolist() == s.block_table[:nb]
        assert meta.prefill_block_tables[i, :nb].tolist() == s.block_table[:nb]
        assert chunk.context_len == a + n and chunk.num_tokens == n
    _, tables32 = meta.prefill_tables_int32()
    assert tables32.dtype == torch.int32 and tables32.shape == meta.prefill_block_tables.shape
