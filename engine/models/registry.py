"""The model families the engine serves, keyed by the config's `model_type` (and the
`architectures` it names): `resolve(config)` is the checkpoint's ModelSpec or an
UnsupportedModelError that names what we cannot serve exactly. Torch-free."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from engine.models.families import (
    gemma,
    gpt_oss,
    granite,
    llama,
    mistral,
    mixtral,
    olmo2,
    olmoe,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
)
from engine.models.spec import ModelSpec, UnsupportedModelError

FAMILIES: dict[str, ModuleType] = {
    t: module
    for module in (
        llama,
        mistral,
        qwen2,
        qwen3,
        gemma,
        phi3,
        olmo2,
        granite,
        mixtral,
        qwen3_moe,
        olmoe,
        gpt_oss,
    )
    for t in module.MODEL_TYPES
}
# `architectures` names of checkpoints whose model_type says nothing more (Hugging Face class names)
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MinistralForCausalLM": "ministral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "Olmo2ForCausalLM": "olmo2",
    "GraniteForCausalLM": "granite",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "OlmoeForCausalLM": "olmoe",
    "GptOssForCausalLM": "gpt_oss",
}
FP8_METHODS = ("fp8",)  # quant_method values whose weights are dequantized on load (engine/models/fp8.py)


def model_type(config: Any) -> str:
    """The family key: config.model_type, else the first known `architectures` name."""
    kind = getattr(config, "model_type", None)
    if kind in FAMILIES:
        return kind
    for arch in getattr(config, "architectures", None) or ():
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    raise UnsupportedModelError(
        f"model type {kind!r} (architectures {getattr(config, 'architectures', None)}) is not supported; "
        f"supported model types: {', '.join(sorted(FAMILIES))}"
    )


def quantization(config: Any) -> dict[str, Any] | None:
    """The checkpoint's quantization_config when its weights can be dequantized on load; raises for
    any other (GPTQ, AWQ, bitsandbytes, ...)."""
    q = getattr(config, "quantization_config", None)
    if not q:
        return None
    q = q if isinstance(q, dict) else q.to_dict()
    method = q.get("quant_method")
    if method == "mxfp4":
        raise UnsupportedModelError(
            "quantization_config with quant_method 'mxfp4' (MXFP4-quantized expert weights, as gpt-oss "
            "ships them) is not supported; load a checkpoint with unquantized (bf16) experts"
        )
    if method not in FP8_METHODS:
        raise UnsupportedModelError(
            f"quantization_config with quant_method {method!r} is not supported (only FP8 checkpoints, "
            "dequantized on load; or load an unquantized checkpoint with quantization='int8')"
        )
    block = q.get("weight_block_size")
    if block is not None and len(block) != 2:
        raise UnsupportedModelError(f"fp8 weight_block_size {block!r} is not supported (two dimensions)")
    return q


def resolve(config: Any) -> ModelSpec:
    """The ModelSpec of a transformers config; UnsupportedModelError naming what is unsupported."""
    kind = model_type(config)
    quantization(config)
    return FAMILIES[kind].spec(config)
