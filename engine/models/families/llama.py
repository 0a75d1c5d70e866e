"""Llama 2 / 3.x (and every checkpoint saved as `LlamaForCausalLM`): pre-norm blocks, gated MLP."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec

MODEL_TYPES = ("llama",)


def spec(config: Any) -> ModelSpec:
    bias = bool(getattr(config, "attention_bias", False))
    types = layer_types(config)
    return base(
        config,
        "llama",
        attention_bias=bias,
        o_bias=bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        layer_types=types,
        window=window(config, types),
    )
