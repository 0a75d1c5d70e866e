"""The forward's elementwise operators for a device and dtype: Triton kernels on CUDA
(engine/kernels/fused_ops.py), the C kernels of engine/models/fused.py on the CPU, else torch."""

from __future__ import annotations

import torch

from engine.models.fused import CPUOps, TorchOps, _library


def make_ops(device: torch.device, dtype: torch.dtype, cpu_kernels: bool) -> TorchOps:
    """TritonOps on CUDA (engine/kernels/fused_ops.py, one launch an operator); CPUOps for fp32 and
    bf16 on the CPU when allowed and a C compiler is there; else TorchOps."""
    if device.type == "cuda":
        from engine.kernels.fused_ops import TritonOps  # imports triton

        return TritonOps()
    if cpu_kernels and device.type == "cpu" and dtype in CPUOps.SUFFIX:
        lib = _library()
        if lib is not None:
            return CPUOps(lib)
    return TorchOps()
