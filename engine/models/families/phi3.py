"""Phi-3 / Phi-4: Llama blocks with fused qkv_proj and gate_up_proj tensors, partial rotary, and
longrope: once a sequence passes original_max_position_embeddings, all of it is computed with the
long factors (transformers' Phi-3 recomputes its cache at that token; so does the model runner)."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec

MODEL_TYPES = ("phi3",)


def spec(config: Any) -> ModelSpec:
    types = layer_types(config, all_slide=True)
    return base(
        config,
        "phi3",
        fused_qkv=True,
        fused_gate_up=True,
        layer_types=types,
        window=window(config, types),
        long_rope_recompute=True,
    )
