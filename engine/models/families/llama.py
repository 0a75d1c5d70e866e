"""Llama 2 / 3.x (and every checkpoint saved as `LlamaForCausalLM`): pre-norm blocks, gated MLP."""

from engine.models.families.common import base, layer_types, window

MODEL_TYPES = ("llama",)


def spec(config):
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
