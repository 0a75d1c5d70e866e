"""Phi-3 / Phi-4: Llama blocks with fused qkv_proj and gate_up_proj tensors, partial rotary, and
longrope (the long factors once a sequence passes original_max_position_embeddings)."""

from engine.models.families.common import base, layer_types, window

MODEL_TYPES = ("phi3",)


def spec(config):
    types = layer_types(config, all_slide=True)
    return base(
        config, "phi3", fused_qkv=True, fused_gate_up=True, layer_types=types, window=window(config, types)
    )
