"""gpt-oss: Llama-shaped blocks with q/k/v/o biases, alternating sliding and full layers, yarn rope,
a per-head attention sink logit in each layer's softmax (`self_attn.sinks`), and a mixture of
experts in every layer: the router (with a bias) takes the top-k logits and softmaxes them; each
expert has biases and the clamped SwiGLU `(clamp(up) + 1) * g * sigmoid(alpha * g)`,
g = min(gate, limit), over gate/up columns stored interleaved in one stacked tensor.

Yarn rope is transformers' own init function (its `truncate` flag included); gpt-oss rotates the
two halves of each head, the same rotation as the other families' rotate_half."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec, MoESpec

MODEL_TYPES = ("gpt_oss",)


def spec(config: Any) -> ModelSpec:
    return full_spec(config)


def full_spec(config: Any) -> ModelSpec:
    """The spec the forward runs (MoE block: engine/models/moe.py; sinks: engine/attention)."""
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
        attn_sinks=True,
    )
