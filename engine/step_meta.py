"""A step's attention metadata over paged block tables, built on the host, and its move to the
device: shared by the model runner and the draft model of speculative decoding."""

from __future__ import annotations

import array
from collections.abc import Callable

import torch

from engine.attention import AttentionMetadata, PrefillChunk
from engine.device import host_to_device
from engine.request import Sequence


def attention_meta(
    block_size: int,
    rows: list[tuple[Sequence, int]],
    chunks: list[tuple[Sequence, int, int]],
    table_of: Callable[[Sequence], list[int]],
) -> AttentionMetadata:
    """The attention metadata of the decode rows (sequence, position) and prefill chunks
    (sequence, first position, tokens) over the block tables `table_of` gives."""
    bs = block_size
    arange_bs = torch.arange(bs)
    slot_parts: list[torch.Tensor] = []
    tables = ctx = None
    if rows:
        lens = [q + 1 for _, q in rows]
        ctx = torch.tensor(lens)
        nb = -(-max(lens) // bs)
        tables = padded_tables([table_of(seq) for seq, _ in rows], nb)  # [B, nb]
        last = ctx - 1
        slot_parts.append(tables.gather(1, (last // bs)[:, None]).view(-1) * bs + last % bs)
    prefills: list[PrefillChunk] = []
    row = len(rows)
    for seq, start, n in chunks:
        table = torch.tensor(pad_table(table_of(seq), -(-(start + n) // bs)))
        slot_parts.append((table[:, None] * bs + arange_bs).view(-1)[start : start + n])
        prefills.append(PrefillChunk(row, n, start + n, table))
        row += n
    return AttentionMetadata(
        slot_mapping=torch.cat(slot_parts),
        block_size=bs,
        num_decodes=len(rows),
        decode_block_tables=tables,
        decode_context_lens=ctx,
        prefills=prefills,
    )


def step_to_device(
    device: torch.device, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The step's host tensors on `device` (asynchronous copies on CUDA)."""
    if device.type == "cpu":
        return ids, pos, meta

    def move(t: torch.Tensor) -> torch.Tensor:
        return host_to_device(t, device)

    for m in (meta, meta.sliding) if meta.sliding is not None else (meta,):
        m.slot_mapping = move(m.slot_mapping)
        if m.decode_block_tables is not None:
            m.decode_block_tables = move(m.decode_block_tables)
        if m.decode_context_lens is not None:
            m.decode_context_lens = move(m.decode_context_lens)
        for chunk in m.prefills:
            chunk.block_ids = move(chunk.block_ids)
    return move(ids), move(pos), meta


def padded_tables(tables: list[list[int]], n: int) -> torch.Tensor:
    """[len(tables), n] int64: pad_table of each, built as one flat C array (torch.tensor of nested
    lists, or a max() per entry, reads every entry in Python: most of a large batch's host time)."""
    flat = array.array("q")
    for table in tables:
        flat.extend(table[:n])
        if len(table) < n:
            flat.extend([0] * (n - len(table)))
    return torch.frombuffer(flat, dtype=torch.int64).view(len(tables), n).clamp_(min=0)


def pad_table(table: list[int], n: int) -> list[int]:
    """The first n entries of a block table, padded with block 0 (masked out by the caller); blocks
    released out of a sliding window (OUT_OF_WINDOW) read as block 0 too (the attention skips them)."""
    table = [max(b, 0) for b in table[:n]]
    return table + [0] * (n - len(table))
