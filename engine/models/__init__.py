"""Model forwards: one decoder loop (llama.py) for every family in the registry (registry.py).

Names resolve lazily: the registry, the specs and the checkpoint check (engine/models/check.py) are
torch-free, so the gateway runs the check without loading torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LlamaModel": "engine.models.llama",
    "FAMILIES": "engine.models.registry",
    "resolve": "engine.models.registry",
    "ModelSpec": "engine.models.spec",
    "UnsupportedModelError": "engine.models.spec",
    "check_folder": "engine.models.check",
    "check_model": "engine.models.check",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
