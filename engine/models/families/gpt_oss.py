"""gpt-oss: Llama-shaped blocks with q/k/v/o biases, alternating sliding and full layers, yarn rope,
a per-head attention sink logit in each layer's softmax (`self_attn.sinks`), and a mixture of
experts in every layer: the router (with a bias) takes the top-k logits and softmaxes them; each
expert has biases and the clamped SwiGLU `(clamp(up) + 1) * g * sigmoid(alpha * g)`,
g = min(gate, limit), over gate/up columns stored interleaved in one stacked tensor.

Refused: the attention backends do not yet add sink logits to the softmax."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec, MoESpec, UnsupportedModelError

MODEL_TYPES = ("gpt_oss",)


def spec(config: Any) -> ModelSpec:
    full_spec(config)  # what else the config asks for is checked first
    raise UnsupportedModelError(
        "gpt_oss: attention sinks (self_attn.sinks, a per-head logit in each softmax's denominator) "
        "are not supported by the attention backends"
    )


def full_spec(config: Any) -> ModelSpec:
    """The spec the forward would run, sinks apart (its MoE block is served: engine/models/moe.py)."""
    types = layer_types(config)
    moe = MoESpec(
        num_experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        intermediate_size=config.intermediate_size,
        softmax_after_topk=True,
        layers=(True,) * config.num_hidden_layers,
        router="router",
        router_bias=True,
        stacked=True,
        expert_bias=True,
        swiglu_limit=float(config.swiglu_limit),
        swiglu_alpha=float(getattr(config, "swiglu_alpha", 1.702)),
    )
    return base(
        config,
        "gpt_oss",
        attention_bias=bool(config.attention_bias),
        o_bias=bool(config.attention_bias),
        layer_types=types,
        window=window(config, types),
        moe=moe,
    )
