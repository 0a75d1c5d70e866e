"""Qwen3-MoE: Qwen3 blocks (q/k RMSNorm per head) whose MLP is a mixture of experts except in the
layers `mlp_only_layers` names and those `decoder_sparse_step` skips (a dense MLP of
`intermediate_size` there); softmax over all experts, top-k, renormalized where `norm_topk_prob`."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec, MoESpec, UnsupportedModelError

MODEL_TYPES = ("qwen3_moe",)


def moe_layers(config: Any) -> tuple[bool, ...]:
    """Per layer: a mixture of experts (transformers' Qwen3MoeDecoderLayer rule)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    return tuple(
        i not in dense and config.num_experts > 0 and (i + 1) % step == 0
        for i in range(config.num_hidden_layers)
    )


def spec(config: Any) -> ModelSpec:
    if getattr(config, "shared_expert_intermediate_size", 0):
        raise UnsupportedModelError("qwen3_moe: shared experts are not supported")
    bias = bool(getattr(config, "attention_bias", False))
    types = layer_types(config, all_slide=True)
    moe = MoESpec(
        num_experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        intermediate_size=config.moe_intermediate_size,
        norm_topk_prob=bool(config.norm_topk_prob),
        layers=moe_layers(config),
    )
    return base(
        config,
        "qwen3_moe",
        qk_norm="head",
        attention_bias=bias,
        o_bias=bias,
        layer_types=types,
        window=window(config, types),
        moe=moe if any(moe.layers) else None,
    )
