"""OLMo 2: no pre-norms; RMSNorms on the attention and MLP outputs, and on all of q and of k (over
every head at once) before rope."""

from typing import Any

from engine.models.families.common import base
from engine.models.spec import ModelSpec, Norms

MODEL_TYPES = ("olmo2",)
NORMS = Norms(
    pre_attn=None, attn_out="post_attention_layernorm", pre_mlp=None, mlp_out="post_feedforward_layernorm"
)


def spec(config: Any) -> ModelSpec:
    bias = bool(getattr(config, "attention_bias", False))
    return base(config, "olmo2", norms=NORMS, qk_norm="all", attention_bias=bias, o_bias=bias)
