"""Compile, before serving, every Triton variant a step can launch: a forward over a step of
padding rows (decodes of context 0, a prefill chunk whose slots are -1: nothing is written) runs
the KV write, decode, prefill and the fused elementwise kernels with the argument types, alignments
and constexprs of real steps, and a split decode compiles the reduce (with attention sinks too, where
the forward's layers have them); each MoE layer's fused-MoE kernel runs once per tile config
(fused_moe.CONFIGS) over one padding token, whatever config the padding step's size picked. Every
argument that varies between steps is `do_not_specialize`, so nothing compiles later
(tests/engine/kernels/test_variants.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.attention import AttentionMetadata, PrefillChunk

if TYPE_CHECKING:
    from engine.models.llama import LlamaModel


@torch.inference_mode()
def warm_up(model: LlamaModel, kv_caches: list[torch.Tensor], block_size: int) -> None:
    """Run `model` (engine/models/llama.py) once over padding; the cache is left as it was."""
    device = kv_caches[0].device
    decodes, chunk = 2, 3
    width = 2 * 64 // block_size + 1  # blocks for two 64-token tiles: room for a split decode

    def on(values: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    # slot -1 writes nothing where the backend honours padding rows (the triton one); the torch
    # reference indexes the cache with it, so it gets slot 0 of block 0: no request holds a block yet
    pad_slot = -1 if model.attention.supports_cuda_graphs else 0
    meta = AttentionMetadata(
        slot_mapping=on([pad_slot] * (decodes + chunk)),
        block_size=block_size,
        num_decodes=decodes,
        decode_block_tables=on([[0] * width] * decodes),
        decode_context_lens=on([0] * decodes),
        prefills=[PrefillChunk(decodes, chunk, chunk, on([0]))],
    )
    ids = on([0] * (decodes + chunk))
    positions = on([0] * decodes + list(range(chunk)))
    model.forward(ids, positions, meta, kv_caches)
    attention = model.attention
    if hasattr(attention, "_decode_kernel"):  # the triton backend: its split path and reduce
        q = torch.zeros(decodes, model.num_heads, model.head_dim, dtype=kv_caches[0].dtype, device=device)
        sinks = torch.zeros(model.num_heads, dtype=torch.float32, device=device)
        # the split decode with sinks too, where the forward's layers had them
        sink_variants = [None, sinks] if getattr(attention, "with_sinks", False) else [None]
        for layer_sinks in sink_variants:
            attention._decode_kernel(
                q,
                kv_caches[0],
                meta.decode_block_tables,
                meta.decode_context_lens,
                block_size,
                1.0,
                num_splits=2,
                sinks=layer_sinks,
            )
    _warm_up_moe(model)


def _warm_up_moe(model: LlamaModel) -> None:
    """Each MoE layer's fused kernel once per tile config, on one padding token routed to experts
    0..k-1 with weight 0."""
    from engine.kernels.fused_moe import CONFIGS

    for layer in model.layers:
        block = layer.moe
        if block is None or block.fused is None:
            continue
        assert block.gate_up is not None and block.down is not None  # what the fused kernel reads
        device = block.gate_up.device
        h = torch.zeros(1, block.gate_up.shape[2], dtype=block.gate_up.dtype, device=device)
        ids = torch.arange(block.top_k, dtype=torch.int64, device=device)[None] % block.num_experts
        weights = torch.zeros(1, block.top_k, dtype=torch.float32, device=device)
        for config in CONFIGS:
            block.fused(h, block.gate_up, block.down, ids, weights, **block.fused_args(), config=config)
