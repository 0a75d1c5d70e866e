"""OLMoE: Llama blocks with RMSNorms on all of q and of k (over every head at once) and a mixture of
experts in every layer: softmax over all experts, top-k (renormalized where `norm_topk_prob`)."""

from typing import Any

from engine.models.families.common import base
from engine.models.spec import ModelSpec, MoESpec, UnsupportedModelError

MODEL_TYPES = ("olmoe",)


def spec(config: Any) -> ModelSpec:
    if getattr(config, "clip_qkv", None) is not None:
        raise UnsupportedModelError(f"olmoe: clip_qkv={config.clip_qkv} is not supported")
    bias = bool(getattr(config, "attention_bias", False))
    moe = MoESpec(
        num_experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        intermediate_size=config.intermediate_size,
        norm_topk_prob=bool(config.norm_topk_prob),
        layers=(True,) * config.num_hidden_layers,
    )
    return base(config, "olmoe", qk_norm="all", attention_bias=bias, o_bias=bias, moe=moe)
