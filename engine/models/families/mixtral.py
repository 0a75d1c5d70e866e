"""Mixtral: Mistral blocks whose MLP is a mixture of experts (`block_sparse_moe`): softmax over
all experts, the top 2 renormalized; experts named w1 (gate), w3 (up), w2 (down)."""

from typing import Any

from engine.models.families.common import base, layer_types, window
from engine.models.spec import ModelSpec, MoESpec

MODEL_TYPES = ("mixtral",)


def spec(config: Any) -> ModelSpec:
    types = layer_types(config, all_slide=True)
    moe = MoESpec(
        num_experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        intermediate_size=config.intermediate_size,
        norm_topk_prob=True,
        layers=(True,) * config.num_hidden_layers,
        block="block_sparse_moe",
        expert_names=("w1", "w3", "w2"),
    )
    return base(config, "mixtral", layer_types=types, window=window(config, types), moe=moe)
