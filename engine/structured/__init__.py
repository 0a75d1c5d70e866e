"""Structured outputs: JSON (any object, or a JSON Schema), a regex or an EBNF grammar constrains
what the engine samples, with xgrammar (docs/api.md, "Structured outputs").

Public names: ``StructuredSpec`` (plain Python: it travels in SamplingParams and the lane message),
``check`` (raise InvalidRequestError if xgrammar refuses a spec), ``StructuredOutputs`` (the
engine's per-step machinery). ``check`` and ``StructuredOutputs`` import xgrammar (and torch) on
first use; ``StructuredSpec`` imports neither. The lazy names are not re-imported under
``TYPE_CHECKING``: `engine.request` loads this package for the spec, and the manager imports the
scheduler, which imports `engine.request` (tests/test_imports.py counts those imports too); engine
modules import them from their own modules.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.structured.spec import KINDS, StructuredSpec

_LAZY = {
    "check": "engine.structured.grammar",
    "StructuredOutputs": "engine.structured.manager",
    "GrammarCache": "engine.structured.cache",
}

__all__ = ["GrammarCache", "KINDS", "StructuredOutputs", "StructuredSpec", "check"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.structured' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
