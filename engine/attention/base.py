"""The attention backend interface and its registry.

A step's tokens are packed: decodes first (one query token each, batched together), then
prefill chunks (several query tokens each, attending to their cached prefix plus themselves).
The K/V cache of one layer is [num_slots, num_kv_heads, head_dim], slot = block * block_size + offset.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class PrefillChunk:
    start: int  # first row of this chunk in the packed batch
    num_tokens: int  # query tokens of the chunk
    context_len: int  # cached prefix + this chunk
    context_slots: torch.Tensor | None  # [context_len] KV slots; None when there is no cached prefix


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each packed token's K/V is written
    num_decodes: int  # the first num_decodes rows are single-token decodes
    decode_slots: torch.Tensor | None  # [num_decodes, max_len] KV slots per decode (padded)
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_len] True where a slot is real
    prefills: list[PrefillChunk]


class AttentionBackend(ABC):
    """Writes this step's K/V into the paged cache and computes attention for every packed token."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, KVH, D]
        v: torch.Tensor,  # [T, KVH, D]
        k_cache: torch.Tensor,  # [S, KVH, D]
        v_cache: torch.Tensor,  # [S, KVH, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H, D]
        ...


BACKENDS: dict[str, type[AttentionBackend]] = {}


def register_backend(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        BACKENDS[name] = cls
        return cls

    return wrap


def make_backend(name: str, num_heads: int, num_kv_heads: int, head_dim: int) -> AttentionBackend:
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(BACKENDS)}") from None
    return cls(num_heads, num_kv_heads, head_dim)
