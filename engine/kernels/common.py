"""What the kernel launchers share: dtype and block choices, the SM count, interpreter mode."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def interpreting() -> bool:
    """True when triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def compute_in_fp32(dtype: torch.dtype) -> bool:
    """Whether a kernel upcasts its operands to fp32 right after loading them. Always in the
    interpreter (its bf16 arithmetic is wrong), and for fp32 caches; on a GPU, bf16/fp16 operands
    go to the tensor cores as they are, accumulating in fp32."""
    return dtype == torch.float32 or interpreting()


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 dots in full precision ("ieee"), not tf32: fp32 runs are held to token-exactness."""
    return "ieee" if compute_in_fp32(dtype) else "tf32"


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


@functools.cache
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def programs_wanted(device: torch.device) -> int:
    """About two waves of programs fill the GPU; the interpreter wants as few programs as possible."""
    if device.type != "cuda":
        return 1
    return 2 * num_sms(device.index if device.index is not None else torch.cuda.current_device())


@triton.jit
def soft_cap(s, cap):
    """cap * tanh(s / cap) (Gemma 2's attention soft-capping), tanh as 1 - 2 / (exp(2x) + 1): exact
    at both ends (exp overflowing to inf gives 1), within 1e-7 of tanh elsewhere."""
    x = s / cap
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0))
