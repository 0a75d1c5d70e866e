"""Turns a step plan into tensors, runs the model over the paged KV cache and samples; owns the
KV cache and the host swap space."""
from __future__ import annotations

import torch

from engine.attention import AttentionBackend, AttentionMetadata, PrefillChunk, make_backend
from engine.config import EngineConfig
from engine.loader import LoadedModel
from engine.models import SUPPORTED_ARCHITECTURES
from engine.sampler import sample
from engine.scheduler import ScheduledSeq, StepPlan
from engine.swap_space import SwapSpace

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    """A config dtype as torch's. "auto": bfloat16 where the hardware computes it natively (a CUDA
    GPU with bf16; a CPU with AVX512-BF16 or AMX, as oneDNN reports), else float32: on an AVX2-only
    CPU bf16 matmuls are emulated and measured 6x slower than float32 (docs/structures.md)."""
    if name != "auto":
        return TORCH_DTYPES[name]
    if torch.cuda.is_available():
        native = torch.cuda.is_bf16_supported()
    else:
        native = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.bfloat16 if native else torch.float32


class ModelRunner:
    def __init__(self, loaded: LoadedModel, config: EngineConfig, max_model_len: int):
        cfg = loaded.config
        self.dtype = resolve_dtype(config.dtype)
        self.block_size = config.block_size
        num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
        backend = make_backend(config.attention_backend, num_heads, self.num_kv_heads, self.head_dim)
        model_cls = SUPPORTED_ARCHITECTURES.get(cfg.model_type)
        if model_cls is None:
            raise ValueError(f"model type {cfg.model_type!r} is not supported; supported: {sorted(SUPPORTED_ARCHITECTURES)}")
        self.model = model_cls.from_state_dict(cfg, loaded.state_dict, self.dtype, backend, max_model_len)
        self.vocab_size = cfg.vocab_size
        self.num_blocks = config.num_kv_blocks or self._blocks_for(config.kv_cache_gib, cfg.num_hidden_layers)
        slots = self.num_blocks * self.block_size
        self.kv_caches = [backend.allocate_cache(slots, self.dtype) for _ in range(cfg.num_hidden_layers)]
        if config.preemption_mode == "recompute":
            num_host_blocks = 0
        elif config.num_swap_blocks is not None:
            num_host_blocks = config.num_swap_blocks
        else:
            num_host_blocks = self._blocks_for(config.swap_space_gib, cfg.num_hidden_layers, at_least=0)
        if config.preemption_mode == "auto" and type(backend).block_view is AttentionBackend.block_view:
            num_host_blocks = 0  # this backend's cache layout cannot be swapped: recompute only
        self.swap_space = SwapSpace(backend, self.kv_caches, self.block_size, num_host_blocks)

    def _blocks_for(self, gib: float, num_layers: int, at_least: int = 1) -> int:
        per_block = num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize
        return max(at_least, int(gib * 2**30 // per_block))

    def swap(self, plan: StepPlan) -> None:
        """The plan's block copies, before its forward: swap-outs first (their device blocks may be
        handed out again in the same step), then swap-ins."""
        if plan.swap_out:
            self.swap_space.swap_out(plan.swap_out)
        if plan.swap_in:
            self.swap_space.swap_in(plan.swap_in)

    def run(self, plan: StepPlan, generators: dict[str, torch.Generator]) -> list[tuple[ScheduledSeq, int]]:
        """Run one step; returns (item, sampled token) for every item that reached its sequence's end."""
        items = sorted(plan.scheduled, key=lambda it: it.num_tokens != 1)  # decodes first (stable)
        input_ids, positions, meta, sample_rows = self._prepare(items)
        hidden = self.model.forward(input_ids, positions, meta, self.kv_caches)
        samplers = [it for it in items if it.samples]
        if not samplers:
            return []
        logits = self.model.logits(hidden[sample_rows])
        params = [it.seq.params for it in samplers]
        gens = [generators.get(it.seq.request_id) for it in samplers]
        return list(zip(samplers, sample(logits, params, gens)))

    def _prepare(self, items: list[ScheduledSeq]):
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        sample_rows: list[int] = []
        decodes = [it for it in items if it.num_tokens == 1]
        for it in decodes:
            p = it.seq.num_computed_tokens
            ids.append(it.seq.token_ids[p])
            pos.append(p)
        for it in items[len(decodes):]:
            start = it.seq.num_computed_tokens
            ids += it.seq.token_ids[start : start + it.num_tokens]
            pos += range(start, start + it.num_tokens)
        for row, it in enumerate(decodes):
            if it.samples:
                sample_rows.append(row)
        arange_bs = torch.arange(bs)
        slot_parts: list[torch.Tensor] = []
        tables = ctx = None
        if decodes:
            ctx = torch.tensor([it.seq.num_computed_tokens + 1 for it in decodes])
            nb = -(-int(ctx.max()) // bs)
            tables = torch.tensor([_pad(it.seq.block_table, nb) for it in decodes])  # [B, nb]
            last = ctx - 1
            slot_parts.append(tables.gather(1, (last // bs)[:, None]).view(-1) * bs + last % bs)
        prefills: list[PrefillChunk] = []
        row = len(decodes)
        for it in items[len(decodes):]:
            start, n = it.seq.num_computed_tokens, it.num_tokens
            table = torch.tensor(it.seq.block_table[: -(-(start + n) // bs)])
            slot_parts.append((table[:, None] * bs + arange_bs).view(-1)[start : start + n])
            prefills.append(PrefillChunk(row, n, start + n, table if start else None))
            row += n
            if it.samples:
                sample_rows.append(row - 1)
        meta = AttentionMetadata(
            slot_mapping=torch.cat(slot_parts),
            block_size=bs,
            num_decodes=len(decodes),
            decode_block_tables=tables,
            decode_context_lens=ctx,
            prefills=prefills,
        )
        # sample_rows follow `items` order restricted to samplers: decodes first, then prefills.
        return torch.tensor(ids), torch.tensor(pos), meta, torch.tensor(sample_rows, dtype=torch.long)


def _pad(table: list[int], n: int) -> list[int]:
    """The first n entries of a block table, padded with block 0 (masked out by the caller)."""
    return table[:n] + [0] * (n - len(table)) if len(table) < n else table[:n]
