"""Granite: Llama blocks with multipliers on the embedding, each residual branch, the attention
scores (its softmax scale) and the logits (divided by logits_scaling)."""

from typing import Any

from engine.models.families.common import base
from engine.models.spec import ModelSpec

MODEL_TYPES = ("granite",)


def spec(config: Any) -> ModelSpec:
    bias = bool(getattr(config, "attention_bias", False))
    return base(
        config,
        "granite",
        attention_bias=bias,
        o_bias=bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        embed_scale=float(config.embedding_multiplier),
        residual_scale=float(config.residual_multiplier),
        attn_scale=float(config.attention_multiplier),
        logits_divisor=float(config.logits_scaling),
    )
