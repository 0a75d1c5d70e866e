"""FP8 checkpoints (quant_method "fp8"), dequantized on load to full precision: the forward then
runs in the compute dtype like any other checkpoint (the activation scales, `input_scale`, are not
needed there).

Block-wise (`weight_block_size` [bn, bk], DeepSeek-V3 / Qwen3-FP8 style): `X.weight_scale_inv`
[ceil(N / bn), ceil(K / bk)] multiplies each bn x bk tile of the float8 weight. Per-tensor or
per-channel: `X.weight_scale`, a scalar or one value per output channel, multiplies the weight."""

from __future__ import annotations

import torch

FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def dequantize(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict with every float8 weight as float32 times its scales; scale tensors dropped."""
    out = {}
    for name, t in sd.items():
        if name.endswith((".weight_scale_inv", ".weight_scale", ".input_scale")):
            continue
        if t.dtype in FP8_DTYPES:
            prefix = name.rsplit(".", 1)[0]
            w = t.float()
            if prefix + ".weight_scale_inv" in sd:
                s = sd[prefix + ".weight_scale_inv"].float()  # [ceil(N / bn), ceil(K / bk)]
                bn, bk = -(-w.shape[0] // s.shape[0]), -(-w.shape[1] // s.shape[1])
                s = s.repeat_interleave(bn, 0)[: w.shape[0]].repeat_interleave(bk, 1)[:, : w.shape[1]]
                w = w * s
            elif prefix + ".weight_scale" in sd:
                s = sd[prefix + ".weight_scale"].float()
                w = w * (s.reshape(-1, 1) if s.numel() == w.shape[0] and s.numel() > 1 else s.reshape(()))
            else:
                raise ValueError(f"fp8 tensor {name} has no weight_scale_inv or weight_scale")
            t = w
        out[name] = t
    return out
