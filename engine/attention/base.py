"""The attention backend interface and its registry.

A step's tokens are packed: decodes first (one query token each, batched together), then
prefill chunks (several query tokens each, attending to their cached prefix plus themselves).
Each backend owns the layout of a layer's KV cache (`allocate_cache`); slots are numbered
block * block_size + offset.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class PrefillChunk:
    start: int  # first row of this chunk in the packed batch
    num_tokens: int  # query tokens of the chunk
    context_len: int  # cached prefix + this chunk (== num_tokens: no cached prefix)
    block_ids: torch.Tensor  # [ceil(context_len / block_size)] the chunk's blocks, in order


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each packed token's K/V is written
    block_size: int
    num_decodes: int  # the first num_decodes rows are single-token decodes
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int64, padded with block 0
    decode_context_lens: torch.Tensor | None  # [num_decodes] int64 tokens in the cache, the new one included
    prefills: list[PrefillChunk]
    # [len(prefills), max blocks] the chunks' tables in one tensor (each chunk's block_ids: a view of
    # its row), where the step's metadata gathered them at once; None: each chunk's own tensor only
    prefill_block_tables: torch.Tensor | None = None
    # Backends that read the chunks as tensors keep them here, built once a step (first layer).
    packed_prefills: object | None = None
    # The cpu backend's int32 decode block tables and context lengths, built once a step (first layer).
    decode_int32: tuple[torch.Tensor, torch.Tensor] | None = None
    # The cpu backend's int32 prefill chunks ([C, 3]: start, num_tokens, context_len) and their block
    # tables ([C, max_blocks], padded with block 0), built once a step (first layer).
    prefill_int32: tuple[torch.Tensor, torch.Tensor] | None = None
    # The sliding layers' own metadata where they have a pool of their own (engine/kv_groups.py).
    sliding: AttentionMetadata | None = None

    def decode_tables_int32(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(block tables, context lengths) of the decodes as contiguous int32, built once a step."""
        if self.decode_int32 is None:
            tables, context_lens = self.decode_block_tables, self.decode_context_lens
            assert tables is not None and context_lens is not None, "a step without decodes"
            self.decode_int32 = (
                tables.to(torch.int32).contiguous(),
                context_lens.to(torch.int32).contiguous(),
            )
        return self.decode_int32

    def prefill_tables_int32(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(chunks [C, 3], block tables [C, max_blocks]) of the prefill chunks as int32, built once a step."""
        if self.prefill_int32 is None:
            chunks = torch.tensor(
                [(c.start, c.num_tokens, c.context_len) for c in self.prefills], dtype=torch.int32
            )
            if self.prefill_block_tables is not None:
                tables = self.prefill_block_tables.to(torch.int32).contiguous()
            else:
                width = max(len(c.block_ids) for c in self.prefills)
                tables = torch.zeros(len(self.prefills), width, dtype=torch.int32)
                for i, c in enumerate(self.prefills):
                    tables[i, : len(c.block_ids)] = c.block_ids
            self.prefill_int32 = (chunks, tables)
        return self.prefill_int32


class AttentionBackend(ABC):
    """Writes this step's K/V into the paged cache and computes attention for every packed token."""

    supports_cuda_graphs = False  # can its decode be captured (padding rows: slot -1, context 0)?
    # whether the model's other Triton kernels (the fused MoE) run with it wherever it runs (the CPU:
    # triton's interpreter, for tests); they always run on a GPU
    triton_kernels = False

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    @abstractmethod
    def allocate_cache(
        self, num_slots: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """One layer's K and V cache, in this backend's layout."""

    def block_view(self, kv_cache: torch.Tensor, block_size: int) -> torch.Tensor:
        """The cache as a view [P, num_blocks, Q]: [:, b] is all of block b (K and V of every head),
        what swap preemption copies to host memory and back. Layouts without such a view raise."""
        raise NotImplementedError(f"{type(self).__name__} cannot swap KV blocks")

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, KVH, D]
        v: torch.Tensor,  # [T, KVH, D]
        kv_cache: torch.Tensor,  # from allocate_cache
        meta: AttentionMetadata,
        window: int = 0,  # a sliding layer: each query sees its last `window` keys, itself included
        softcap: float = 0.0,  # scores -> softcap * tanh(scores / softcap) before the softmax (0: none)
        # [H] fp32 attention-sink logits (gpt-oss): each head's sink joins its softmax's denominator
        # and contributes no value, so a query's probabilities over its keys sum to less than 1
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [T, H, D]
        ...


BACKENDS: dict[str, type[AttentionBackend]] = {}


def register_backend(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        BACKENDS[name] = cls
        return cls

    return wrap


def make_backend(
    name: str, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device | str = "cpu"
) -> AttentionBackend:
    """The backend `name` for a model on `device`. "auto": "triton" on CUDA, "cpu" (C kernel) on the
    CPU, "torch" where the preferred one cannot run (no triton, no C compiler, an unsupported shape)."""
    device = torch.device(device)
    if name == "auto":
        try:
            preferred = "triton" if device.type == "cuda" else "cpu"
            return make_backend(preferred, num_heads, num_kv_heads, head_dim, device)
        except (RuntimeError, ValueError, OSError, ImportError):
            name = "torch"
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise ValueError(
            "the triton attention backend needs a CUDA device (or TRITON_INTERPRET=1 to run "
            "its kernels in triton's CPU interpreter, for tests)"
        )
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(BACKENDS)}") from None
    return cls(num_heads, num_kv_heads, head_dim)
