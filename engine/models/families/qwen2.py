"""Qwen2 / Qwen2.5: Llama blocks with q/k/v biases; sliding layers where `use_sliding_window` names
them (config.layer_types)."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec

MODEL_TYPES = ("qwen2",)


def spec(config: Any) -> ModelSpec:
    types = layer_types(config)
    return base(config, "qwen2", attention_bias=True, layer_types=types, window=window(config, types))
