"""Named errors of a bad or unusable LoRA adapter. Each names what is wrong; `param` is the part at
fault: "adapter_config" (adapter_config.json), "adapter_model" (adapter_model.safetensors) or
"lora" (the request's adapter reference). The gateway answers all of them with 400."""

from __future__ import annotations

from engine.errors import InvalidRequestError


class AdapterError(InvalidRequestError):
    """Base class: the adapter cannot be served by this engine."""

    code = "invalid_adapter"


class AdapterNotFoundError(AdapterError):
    """The adapter folder or one of its two files is missing."""

    code = "adapter_not_found"


class AdapterConfigError(AdapterError):
    """adapter_config.json is not valid JSON or lacks a required field (r, lora_alpha, ...)."""

    code = "invalid_adapter_config"


class UnsupportedAdapterError(AdapterError):
    """A PEFT feature this engine does not serve (DoRA, modules_to_save, bias, rank_pattern, ...)."""

    code = "unsupported_adapter"


class UnsupportedTargetModuleError(UnsupportedAdapterError):
    """A target module other than q/k/v/o/gate/up/down_proj (embeddings, lm_head, ...)."""

    code = "unsupported_target_module"


class AdapterRankError(AdapterError):
    """The adapter's rank is over the engine's max_lora_rank (or not positive)."""

    code = "adapter_rank_too_large"


class AdapterBaseMismatchError(AdapterError):
    """The adapter was trained for another base model: a layer or a shape does not match."""

    code = "adapter_base_mismatch"


class AdapterWeightsError(AdapterError):
    """adapter_model.safetensors is truncated or malformed, or tensors are missing, extra or
    mis-shaped."""

    code = "invalid_adapter_weights"


class LoRADisabledError(AdapterError):
    """A request names an adapter but the engine was started with max_loras=0."""

    code = "lora_disabled"
