"""Qwen3: Llama blocks with an RMSNorm over each head of q and k before rope."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec

MODEL_TYPES = ("qwen3",)


def spec(config: Any) -> ModelSpec:
    bias = bool(getattr(config, "attention_bias", False))
    types = layer_types(config)
    return base(
        config,
        "qwen3",
        qk_norm="head",
        attention_bias=bias,
        o_bias=bias,
        layer_types=types,
        window=window(config, types),
    )
