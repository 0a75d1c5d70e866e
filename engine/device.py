"""Which device and dtype an engine runs in: the config's names resolved against the hardware."""

from __future__ import annotations

import platform

import torch

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """A config device as torch's. "auto": the current CUDA GPU when torch sees one, else the CPU."""
    if name == "auto":
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: torch sees no CUDA GPU (torch.cuda.is_available() is False)")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        device = torch.device("cuda", index)
    return device


def resolve_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    """A config dtype as torch's. "auto": the fastest measured dtype for the device
    (docs/performance.md, "Which dtype auto picks"): bfloat16 on a CUDA GPU with bf16; on an x86
    CPU, bfloat16 where it has native bf16 dot products (AVX512-BF16 or AMX-BF16: the bf16 C linear,
    faster than float32 in batched steps), else float32 (AVX2, where bf16 has no dot products: torch's
    bf16 matmul measured 6x slower than float32 and the own AVX2 bf16 kernel still slower than the
    fp32 one; AVX-512 without BF16 alike); on
    other CPUs, bfloat16 where oneDNN reports native bf16."""
    if name != "auto":
        return TORCH_DTYPES[name]
    device = device or resolve_device("auto")
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
    elif platform.machine().lower() in ("x86_64", "amd64"):
        native = bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    else:
        native = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.bfloat16 if native else torch.float32


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (/proc/cpuinfo); empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: through pinned memory and an asynchronous copy on CUDA (ordered
    on the current stream before the kernels that read it), as is on the CPU."""
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def device_to_select(device: torch.device) -> int | None:
    """The CUDA device index the calling thread must make current before Triton launches on
    `device` (Triton, and torch's current-stream ops, launch on the current device, not the
    tensors'), or None where nothing is to be set (the CPU)."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else 0


def select_device(device: torch.device) -> None:
    """Make `device` current for this thread (`torch.cuda.set_device`; the current device is
    per thread, so the engine calls this in every thread that runs a step)."""
    index = device_to_select(device)
    if index is not None and torch.cuda.current_device() != index:
        torch.cuda.set_device(index)
