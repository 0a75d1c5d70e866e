"""CPU backend: attention in small C kernels that read the paged cache in place.

The torch reference gathers every decode's K/V into a padded copy each step and layer; on CPU
that copy costs more than the attention itself. This backend compiles `csrc/paged_decode.c` with
the system C compiler on first use (engine/native.py) and calls it through ctypes. bf16 prefill
chunks run a flash-style C kernel (`csrc/paged_prefill_bf16.h`) where the CPU has AVX512-BF16 and
head_dim is a multiple of 32; other prefill chunks (fp32, other head sizes, other CPUs) use the
reference path (SDPA). Without a C compiler, `make_backend("cpu")` raises and the engine can fall
back to "torch".
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from engine import native
from engine.attention.base import AttentionMetadata, register_backend
from engine.attention.torch_ref import TorchAttention

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.c"
_LIB: ctypes.CDLL | None = None


def load_library() -> ctypes.CDLL:
    """Compile (once per source version and machine) and load the kernel library."""
    global _LIB
    if _LIB is None:
        lib = native.load(SOURCE)
        for name in ("paged_decode_window_f32", "paged_decode_window_bf16"):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = (
                [ctypes.c_void_p] * 5
                + [ctypes.c_int] * 4
                + [ctypes.c_long]
                + [ctypes.c_int] * 2
                + [ctypes.c_float, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
            )
        lib.paged_prefill_bf16.restype = None
        prefill_args: list[type] = [ctypes.c_void_p] * 4
        lib.paged_prefill_bf16.argtypes = (
            prefill_args
            + [ctypes.c_int, ctypes.c_void_p]
            + [ctypes.c_int] * 3
            + [ctypes.c_long]
            + [ctypes.c_int] * 2
            + [ctypes.c_float, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
        )
        lib.kv_write.restype = None
        P, N, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
        lib.kv_write.argtypes = [P, P, L, L, P, P, N, N, N, L, N]
        lib.paged_prefill_bf16_supported.restype = ctypes.c_int
        lib.paged_prefill_bf16_supported.argtypes = [ctypes.c_int]
        _LIB = lib
    return _LIB


@register_backend("cpu")
class CPUPagedAttention(TorchAttention):
    KERNELS = {torch.float32: "paged_decode_window_f32", torch.bfloat16: "paged_decode_window_bf16"}

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__(num_heads, num_kv_heads, head_dim)
        if head_dim > 256 or num_heads // num_kv_heads > 16:
            raise ValueError("the cpu kernel supports head_dim <= 256 and <= 16 query heads per KV head")
        self.lib = load_library()
        # bf16 prefill chunks in C: AVX512-BF16 and head_dim a multiple of 32 (else SDPA)
        self.prefill_kernel = bool(self.lib.paged_prefill_bf16_supported(head_dim))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if meta.prefills or self.KERNELS.get(q.dtype) is None or q.device.type != "cpu":
            # the reference's forward: its K/V writes, then this backend's _decode and _prefill
            return super().forward(q, k, v, kv_cache, meta, window, softcap, sinks)
        # A decode-only step: the K/V writes and the kernel, its output written in place.
        self.write_kv(k, v, kv_cache, meta.slot_mapping)
        return self._decode(q, kv_cache, meta, window, softcap, sinks)

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
        """As the reference's, in one C call (`kv_write`) where each row's heads are contiguous."""
        T, KVH, D = k.shape
        if (
            k.dtype == v.dtype == kv_cache.dtype
            and kv_cache.is_contiguous()
            and slots.dtype == torch.int64
            and slots.is_contiguous()
            and all(x.stride(2) == 1 and x.stride(1) == D for x in (k, v))
        ):
            self.lib.kv_write(
                k.data_ptr(),
                v.data_ptr(),
                k.stride(0),
                v.stride(0),
                slots.data_ptr(),
                kv_cache.data_ptr(),
                T,
                KVH,
                D,
                kv_cache.shape[2],
                k.element_size(),
            )
            return
        super().write_kv(k, v, kv_cache, slots)

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        out: torch.Tensor,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> None:
        if not (
            self.prefill_kernel
            and q.dtype == kv_cache.dtype == torch.bfloat16
            and q.device.type == "cpu"
            and kv_cache.is_contiguous()
        ):
            return super()._prefill(q, k, v, kv_cache, meta, out, window, softcap, sinks)
        if sinks is not None:  # [H] fp32, read in place by the kernel
            if sinks.shape != (q.shape[1],):
                raise ValueError(f"sinks must be [num_heads] = [{q.shape[1]}], got {list(sinks.shape)}")
            sinks = sinks.to(torch.float32).contiguous()
        q = q.contiguous()
        dst = out if out.is_contiguous() else torch.empty_like(q)  # the kernel writes [T, H, D] rows
        chunks, tables = meta.prefill_tables_int32()
        self.lib.paged_prefill_bf16(
            q.data_ptr(),
            kv_cache.data_ptr(),
            chunks.data_ptr(),
            tables.data_ptr(),
            len(meta.prefills),
            dst.data_ptr(),
            q.shape[1],
            self.num_kv_heads,
            self.head_dim,
            kv_cache.shape[2],
            meta.block_size,
            tables.shape[1],
            self.scale,
            window,
            softcap,
            None if sinks is None else sinks.data_ptr(),
            torch.get_num_threads(),
        )
        if dst is not out:
            out[meta.num_decodes :] = dst[meta.num_decodes :]

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        kernel = self.KERNELS.get(q.dtype)
        if kernel is None or q.device.type != "cpu":
            return super()._decode(q, kv_cache, meta, window, softcap, sinks)
        if sinks is not None:  # [H] fp32, read in place by the kernel
            if sinks.shape != (q.shape[1],):
                raise ValueError(f"sinks must be [num_heads] = [{q.shape[1]}], got {list(sinks.shape)}")
            sinks = sinks.to(torch.float32).contiguous()
        B, H, D = q.shape
        q = q.contiguous()
        out = torch.empty_like(q)
        tables, ctx = meta.decode_tables_int32()
        getattr(self.lib, kernel)(
            q.data_ptr(),
            kv_cache.data_ptr(),
            tables.data_ptr(),
            ctx.data_ptr(),
            out.data_ptr(),
            B,
            H,
            self.num_kv_heads,
            D,
            kv_cache.shape[2],
            meta.block_size,
            tables.shape[1],
            self.scale,
            window,
            softcap,
            None if sinks is None else sinks.data_ptr(),
            torch.get_num_threads(),
        )
        return out
