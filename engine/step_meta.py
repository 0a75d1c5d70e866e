"""A step's attention metadata over paged block tables and its move to the device: shared by the
model runner and the draft model of speculative decoding. The block tables are read from their rows
on the device (engine/block_tables.py); the rest is built on the host and copied."""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata, PrefillChunk
from engine.block_tables import DeviceBlockTables
from engine.device import host_to_device
from engine.request import Sequence


def attention_meta(
    block_size: int,
    rows: list[tuple[Sequence, int]],
    chunks: list[tuple[Sequence, int, int]],
    tables: DeviceBlockTables,
) -> AttentionMetadata:
    """The attention metadata of the decode rows (sequence, position) and prefill chunks
    (sequence, first position, tokens) over the block tables `tables` keeps: the batch's tables are
    gathered from their rows on the device, the slots of the new tokens computed here."""
    bs = block_size
    tables.sync()
    slots = [max(tables.table(seq)[q // bs], 0) * bs + q % bs for seq, q in rows]  # as the rows read
    slot_parts = [torch.tensor(slots, dtype=torch.int64)]
    decode_tables = ctx = None
    if rows:
        lens = [q + 1 for _, q in rows]
        ctx = torch.tensor(lens)
        decode_tables = tables.gather([seq for seq, _ in rows], -(-max(lens) // bs))  # [B, nb]
    prefills: list[PrefillChunk] = []
    prefill_tables = None
    if chunks:
        widths = [-(-(start + n) // bs) for _, start, n in chunks]
        prefill_tables = tables.gather([seq for seq, _, _ in chunks], max(widths))  # [C, max nb]
        arange_bs = torch.arange(bs)
        row = len(rows)
        for i, (seq, start, n) in enumerate(chunks):
            first = start // bs  # the chunk's own blocks: never out of the window
            blocks = torch.tensor(tables.table(seq)[first : widths[i]]).clamp_(min=0)
            offset = start - first * bs
            slot_parts.append((blocks[:, None] * bs + arange_bs).view(-1)[offset : offset + n])
            prefills.append(PrefillChunk(row, n, start + n, prefill_tables[i, : widths[i]]))
            row += n
    return AttentionMetadata(
        slot_mapping=torch.cat(slot_parts),
        block_size=bs,
        num_decodes=len(rows),
        decode_block_tables=decode_tables,
        decode_context_lens=ctx,
        prefills=prefills,
        prefill_block_tables=prefill_tables,
    )


def step_to_device(
    device: torch.device, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The step's host tensors on `device` (asynchronous copies on CUDA)."""
    if device.type == "cpu":
        return ids, pos, meta

    def move(t: torch.Tensor) -> torch.Tensor:  # block tables are gathered on the device already
        return t if t.device.type != "cpu" else host_to_device(t, device)

    for m in (meta, meta.sliding) if meta.sliding is not None else (meta,):
        m.slot_mapping = move(m.slot_mapping)
        if m.decode_block_tables is not None:
            m.decode_block_tables = move(m.decode_block_tables)
        if m.decode_context_lens is not None:
            m.decode_context_lens = move(m.decode_context_lens)
        for chunk in m.prefills:
            chunk.block_ids = move(chunk.block_ids)
    return move(ids), move(pos), meta
