"""Write one step's K and V into the paged cache: cache[kvh, slot_mapping[t], :] = k[t, kvh, :].

Cache layout (engine/attention/torch_ref.py): [2, KVH, slots, D]. One program per token writes
every head of K and V. A negative slot is a padding row (a CUDA graph's unused batch rows): skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import next_pow2


@triton.jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,  # k, v: [T, KVH, D], unit stride on D
    stride_cv,
    stride_ch,
    stride_cs,  # cache: [2, KVH, slots, D], unit stride on D
    KVH: tl.constexpr,
    KVH_PAD: tl.constexpr,
    D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, KVH_PAD)[:, None]
        d = tl.arange(0, D)[None, :]
        mask = h < KVH
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
        dst = cache_ptr + h.to(tl.int64) * stride_ch + slot * stride_cs + d  # int64: caches pass 2**31
        tl.store(dst, k, mask=mask)
        tl.store(dst + stride_cv, v, mask=mask)


def kv_cache_write(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: [T, KVH, D]; kv_cache: [2, KVH, slots, D]; slot_mapping: [T] (negative: skip)."""
    T, KVH, D = k.shape
    if T == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and kv_cache.stride(-1) == 1
    _kv_write_kernel[(T,)](
        k,
        v,
        kv_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        KVH=KVH,
        KVH_PAD=next_pow2(KVH),
        D=D,
    )
