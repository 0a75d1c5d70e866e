"""Gemma 2 and Gemma 3 (text): (1 + w) RMSNorms before and after attention and the MLP, GELU-tanh,
the embedding times sqrt(hidden), softmax scale query_pre_attn_scalar ** -0.5, alternating sliding
layers; Gemma 2 soft-caps the attention scores and the logits, Gemma 3 norms q and k per head and
gives its sliding and global layers their own rope."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec, Norms, UnsupportedModelError

MODEL_TYPES = ("gemma2", "gemma3_text")
NORMS = Norms(
    pre_attn="input_layernorm",
    attn_out="post_attention_layernorm",
    pre_mlp="pre_feedforward_layernorm",
    mlp_out="post_feedforward_layernorm",
)


def spec(config: Any) -> ModelSpec:
    gemma3 = config.model_type == "gemma3_text"
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError("gemma3_text: use_bidirectional_attention is not supported")
    bias = bool(getattr(config, "attention_bias", False))
    types = layer_types(config)
    return base(
        config,
        config.model_type,
        norms=NORMS,
        norm_offset=1.0,
        qk_norm="head" if gemma3 else None,
        attention_bias=bias,
        o_bias=bias,
        activation=getattr(config, "hidden_activation", None) or config.hidden_act,
        embed_scale=config.hidden_size**0.5,
        embed_scale_in_dtype=True,
        attn_scale=config.query_pre_attn_scalar**-0.5,
        attn_softcap=float(getattr(config, "attn_logit_softcapping", None) or 0.0),
        final_softcap=float(getattr(config, "final_logit_softcapping", None) or 0.0),
        layer_types=types,
        window=window(config, types),
        per_type_rope=gemma3,
        tied=True,
    )
