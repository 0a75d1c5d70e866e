"""Mistral and Ministral: Llama blocks; every layer slides when `sliding_window` is set (Ministral:
the layers its `layer_types` name)."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec

MODEL_TYPES = ("mistral", "ministral")


def spec(config: Any) -> ModelSpec:
    types = layer_types(config, all_slide=True)
    return base(config, config.model_type, layer_types=types, window=window(config, types))
