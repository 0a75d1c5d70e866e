"""What an adapter must match: the base model's layer count and projection shapes, and the
projections LoRA may target. Plain Python (no torch), so a gateway can validate an upload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# PEFT module name -> (fused projection of our forward, index of the module inside it).
# Our forward fuses q/k/v into one matmul and gate/up into another (engine/models/llama.py); a base
# whose checkpoint fuses them too (Phi-3) has adapters on qkv_proj and gate_up_proj, each the whole
# of its projection.
TARGET_MODULES: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "o_proj": ("o", 0),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
    "qkv_proj": ("qkv", 0),
    "gate_up_proj": ("gate_up", 0),
}
# Fused projection -> its modules, in the order of their output columns.
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
# The same for a base whose checkpoint fuses them (its q, k, v rows, and gate, up rows, in our order)
FUSED_PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qkv": ("qkv_proj",),
    "o": ("o_proj",),
    "gate_up": ("gate_up_proj",),
    "down": ("down_proj",),
}
FUSED_CHECKPOINTS = ("phi3",)  # model_type values whose checkpoints have qkv_proj and gate_up_proj
# Which block of a decoder layer holds a module (the PEFT key names it).
MODULE_PARENT = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
    "qkv_proj": "self_attn",
    "gate_up_proj": "mlp",
}
# model_type values whose projections an adapter's modules map onto
ARCHITECTURES = (
    "llama",
    "mistral",
    "ministral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "olmo2",
    "granite",
    "phi3",
)

# mixtures of experts (engine/models/moe.py): no LoRA on their expert MLPs, so none on the model
MOE_ARCHITECTURES = ("mixtral", "qwen3_moe", "olmoe", "gpt_oss")


@dataclass(frozen=True)
class ModelShape:
    """The base model's dimensions that an adapter's tensors must fit."""

    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """From a transformers config object or its dict (config.json)."""
        d = config if isinstance(config, dict) else config.to_dict()
        heads = d["num_attention_heads"]
        return cls(
            model_type=d.get("model_type", "llama"),
            num_layers=d["num_hidden_layers"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
        )

    @property
    def projections(self) -> dict[str, tuple[str, ...]]:
        """Fused projection of our forward -> the base's modules in it, in output-column order."""
        return FUSED_PROJECTIONS if self.model_type in FUSED_CHECKPOINTS else PROJECTIONS

    @property
    def target_modules(self) -> tuple[str, ...]:
        """The modules an adapter of this base may target, in the projections' order."""
        return tuple(m for modules in self.projections.values() for m in modules)

    def module_dims(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of a target module's base weight."""
        h, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
            "qkv_proj": (h, q + 2 * kv),
            "gate_up_proj": (h, 2 * i),
        }[module]

    def projection_dims(self, projection: str) -> tuple[int, int]:
        """(in_features, out_features) of a fused projection: its modules' outputs side by side."""
        modules = self.projections[projection]
        return self.module_dims(modules[0])[0], sum(self.module_dims(m)[1] for m in modules)

    def column_offsets(self, projection: str) -> dict[str, int]:
        """First output column of each module inside its fused projection."""
        offsets, col = {}, 0
        for m in self.projections[projection]:
            offsets[m] = col
            col += self.module_dims(m)[1]
        return offsets
