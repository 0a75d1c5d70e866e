"""An adapter's tensors in host memory, laid out as the device slots hold them.

For each fused projection of our forward (qkv, o, gate_up, down) with m modules (ModelShape.
projections: q/k/v and gate/up apart, or Phi-3's qkv_proj and gate_up_proj whole, m = 1), in_features
`in` and the modules' outputs side by side (`out`):
    a: [L, r, m, in]    a[l, i, j] = row i of module j's lora_A           (zeros where absent)
    b: [L, r, m, out]   b[l, i, j, cols of module j] = column i of lora_B * scaling, 0 elsewhere
so that for one layer, x @ a[l].view(r*m, in).T @ b[l].view(r*m, out) is the sum over the fused
modules of PEFT's  scaling * B_j(A_j(x))  in the fused output columns (B is block-diagonal over
modules: one matmul per projection instead of m). Rank-major order (i before j) keeps a[l, :k]
contiguous for any k <= r, so a slot padded to max_lora_rank is used at the adapter's own rank.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors

from engine.lora.adapter import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterSpec,
    inspect_adapter,
    parse_config,
    read_header,
)
from engine.lora.errors import AdapterNotFoundError
from engine.lora.shape import ModelShape


@dataclass
class LoRAWeights:
    uid: str  # content digest of both files: the adapter's identity (prefix cache, slots)
    name: str
    spec: AdapterSpec
    a: dict[str, torch.Tensor]  # projection -> [L, r, m, in]; only projections the adapter targets
    b: dict[str, torch.Tensor]  # projection -> [L, r, m, out]

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.a.values(), *self.b.values()))


def load_adapter(
    path: str | Path, shape: ModelShape, max_rank: int, dtype: torch.dtype, name: str = ""
) -> LoRAWeights:
    """Read, validate and lay out a PEFT adapter folder (see the module docstring)."""
    path = Path(path)
    try:
        config = (path / CONFIG_FILE).read_bytes()
    except OSError:
        raise AdapterNotFoundError(
            f"no {CONFIG_FILE} in adapter folder {str(path)!r}", param="adapter_config"
        ) from None
    try:
        data = (path / WEIGHTS_FILE).read_bytes()
    except OSError:
        raise AdapterNotFoundError(
            f"no {WEIGHTS_FILE} in adapter folder {str(path)!r}", param="adapter_model"
        ) from None
    parse_config(config, max_rank)
    spec = inspect_adapter(config, read_header(data, len(data)), shape, max_rank, len(config) + len(data))
    uid = hashlib.sha256(hashlib.sha256(config).digest() + data).hexdigest()[:24]
    tensors = load_safetensors(data)
    r, scale = spec.rank, spec.scaling
    by_key = {(e.layer, e.module, e.matrix): tensors[e.name] for e in spec.tensors}
    a: dict[str, torch.Tensor] = {}
    b: dict[str, torch.Tensor] = {}
    for proj, modules in shape.projections.items():
        if not any(m in spec.target_modules for m in modules):
            continue
        d_in, d_out = shape.projection_dims(proj)
        cols = shape.column_offsets(proj)
        pa = torch.zeros(shape.num_layers, r, len(modules), d_in)
        pb = torch.zeros(shape.num_layers, r, len(modules), d_out)
        for j, module in enumerate(modules):
            width = shape.module_dims(module)[1]
            for layer in spec.layers:
                if (layer, module, "A") not in by_key:
                    continue
                pa[layer, :, j] = by_key[(layer, module, "A")].float()  # [r, in]
                pb[layer, :, j, cols[module] : cols[module] + width] = (
                    by_key[(layer, module, "B")].float().T * scale
                )
        a[proj], b[proj] = pa.to(dtype), pb.to(dtype)
    return LoRAWeights(uid=uid, name=name or path.name, spec=spec, a=a, b=b)
