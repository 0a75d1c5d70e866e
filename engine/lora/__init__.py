"""Multi-LoRA serving: adapter validation (torch-free), a host-memory cache, device slots with
LRU eviction, and batched LoRA in the forward (every row of a packed batch may use a different
adapter or none). docs/lora.md describes the design.

Torch-free names (a gateway validating uploads needs only these) load without torch; the
manager, slots and kernels load torch on first use (PEP 562)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AdapterSpec": "engine.lora.adapter",
    "inspect_adapter": "engine.lora.adapter",
    "inspect_adapter_dir": "engine.lora.adapter",
    "parse_config": "engine.lora.adapter",
    "read_header": "engine.lora.adapter",
    "CONFIG_FILE": "engine.lora.adapter",
    "WEIGHTS_FILE": "engine.lora.adapter",
    "ModelShape": "engine.lora.shape",
    "TARGET_MODULES": "engine.lora.shape",
    "AdapterError": "engine.lora.errors",
    "AdapterNotFoundError": "engine.lora.errors",
    "AdapterConfigError": "engine.lora.errors",
    "UnsupportedAdapterError": "engine.lora.errors",
    "UnsupportedTargetModuleError": "engine.lora.errors",
    "AdapterRankError": "engine.lora.errors",
    "AdapterBaseMismatchError": "engine.lora.errors",
    "AdapterWeightsError": "engine.lora.errors",
    "LoRADisabledError": "engine.lora.errors",
    "LoRARequest": "engine.lora.request",
    "LoRAManager": "engine.lora.manager",
    "LoRABatch": "engine.lora.batch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.lora' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
