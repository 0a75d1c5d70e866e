"""Attention backends behind one interface: `make_backend(name, ...)`."""

from engine.attention import cpu_paged, torch_ref, triton_backend  # noqa: F401  (register "cpu", "torch", "triton")
from engine.attention.base import (
    BACKENDS,
    AttentionBackend,
    AttentionMetadata,
    PrefillChunk,
    make_backend,
    register_backend,
)

__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "PrefillChunk",
    "make_backend",
    "register_backend",
]
