"""Tiny random checkpoints of every registered family, saved by transformers, with each family's
switches on: windows shorter than the test prompts, soft-caps small enough to bite, longrope past
its original context; every norm weight and bias is perturbed so that an ignored one shows."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GptOssConfig,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Olmo2Config,
    OlmoeConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    eos_token_id=1,
    bos_token_id=0,
    pad_token_id=0,
    initializer_range=0.1,
)
WINDOW = 8  # shorter than the prompts (tests/engine/models/test_families.py)
ORIGINAL_CONTEXT = 16  # longrope's original_max_position_embeddings


def _longrope(rotary_dim: int) -> dict:
    half = rotary_dim // 2
    return dict(
        rope_type="longrope",
        rope_theta=10000.0,
        short_factor=[1.0 + 0.1 * i for i in range(half)],
        long_factor=[2.0 + 0.5 * i for i in range(half)],
        original_max_position_embeddings=ORIGINAL_CONTEXT,
    )


CONFIGS = {
    "llama": lambda: LlamaConfig(
        **BASE, attention_bias=True, mlp_bias=True, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=False
    ),
    "llama-longrope": lambda: LlamaConfig(**BASE, rope_parameters=_longrope(16)),
    "mistral": lambda: MistralConfig(**BASE, sliding_window=WINDOW, head_dim=16),
    "qwen2": lambda: Qwen2Config(
        **BASE, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, tie_word_embeddings=True
    ),
    "qwen3": lambda: Qwen3Config(
        **BASE, head_dim=16, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    "gemma2": lambda: Gemma2Config(
        **BASE,
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=WINDOW,
        attn_logit_softcapping=1.5,
        final_logit_softcapping=3.0,
    ),
    "gemma3": lambda: Gemma3TextConfig(
        **BASE,
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
        },
    ),
    "phi3": lambda: Phi3Config(
        **BASE,
        sliding_window=12,
        original_max_position_embeddings=ORIGINAL_CONTEXT,
        rope_parameters={**_longrope(8), "partial_rotary_factor": 0.5},
    ),
    "olmo2": lambda: Olmo2Config(**BASE, attention_bias=True),
    "granite": lambda: GraniteConfig(
        **BASE,
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=4.0,
        attention_bias=True,
        mlp_bias=True,
    ),
    # mixtures of experts: 8 experts, top-2 to top-4, 3 layers; Qwen3-MoE's middle layer dense
    "mixtral": lambda: MixtralConfig(
        **{**BASE, "num_hidden_layers": 3}, num_local_experts=8, num_experts_per_tok=2, sliding_window=WINDOW
    ),
    "qwen3_moe": lambda: Qwen3MoeConfig(
        **{**BASE, "num_hidden_layers": 3},
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=4,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        use_sliding_window=True,
        sliding_window=WINDOW,
    ),
    "olmoe": lambda: OlmoeConfig(
        **{**BASE, "num_hidden_layers": 3}, num_experts=8, num_experts_per_tok=3, attention_bias=True
    ),
    # gpt-oss: sliding / full layers, yarn past its original context, a SwiGLU limit that clamps
    # (random weights with noisy biases put gate and up past 0.5), sinks perturbed like biases
    "gpt_oss": lambda: GptOssConfig(
        **{**BASE, "num_hidden_layers": 3, "intermediate_size": 32},
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=3,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        swiglu_limit=0.5,
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=150000.0,
            factor=8.0,  # max_position_embeddings / original context
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
            original_max_position_embeddings=ORIGINAL_CONTEXT,
        ),
    ),
}
MOE = ("mixtral", "qwen3_moe", "olmoe", "gpt_oss")


def save_family(name: str, folder: Path, seed: int = 0) -> Path:
    """The family's tiny random checkpoint, noisy norms and biases, saved in `folder`."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.float32).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
            if pname.endswith("sinks"):  # logits near the scores' own scale: the sink takes a share
                p.add_(torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def load_hf(folder: Path):
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
