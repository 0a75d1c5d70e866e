"""fairlane's inference engine: paged KV cache, continuous batching, our own Llama forward.

Public API (other packages import only these names):
    Engine, EngineConfig, LLM, SamplingParams, TokenLogprob, StructuredSpec, RequestOutput, SLOLoad,
    Room (what Engine.room returns), LoRARequest, EngineRequest (what Engine.add takes), ErrorCode and
    FinishReason (engine/codes.py), check_prompt and check_context (engine/prompt_checks.py), errors
    (AdapterError and its subclasses in engine.lora).

Names are resolved lazily (PEP 562): ``from engine import SamplingParams`` loads only the
torch-free modules that define it, so a gateway replica imports the wire types without torch;
``Engine`` and ``LLM`` load the model side (torch) on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "CacheConfig": "engine.config",
    "EngineConfig": "engine.config",
    "SchedulerConfig": "engine.config",
    "LoRAConfig": "engine.config",
    "ContextLengthExceededError": "engine.errors",
    "DuplicateRequestError": "engine.errors",
    "EngineError": "engine.errors",
    "InvalidRequestError": "engine.errors",
    "SLOUnattainableError": "engine.errors",
    "ErrorCode": "engine.codes",
    "FinishReason": "engine.codes",
    "EngineRequest": "engine.engine_request",
    "check_context": "engine.prompt_checks",
    "check_prompt": "engine.prompt_checks",
    "RequestOutput": "engine.request",
    "SamplingParams": "engine.request",
    "TokenLogprob": "engine.request",
    "StructuredSpec": "engine.structured.spec",
    "SLOLoad": "engine.scheduler.load",
    "Room": "engine.scheduler.room",
    "predict_ttft": "engine.scheduler.load",
    "POLICY_PARTS": "engine.scheduler.registry",
    "parse_policy": "engine.scheduler.registry",
    "Engine": "engine.engine",
    "calibrate": "engine.calibrate",
    "LLM": "engine.llm",
    "Completion": "engine.llm",
    "LoRARequest": "engine.lora.request",
    "AdapterError": "engine.lora.errors",
    "UnsupportedModelError": "engine.models.spec",
    "check_model": "engine.models.check",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from engine.calibrate import calibrate
    from engine.codes import ErrorCode, FinishReason
    from engine.config import CacheConfig, EngineConfig, LoRAConfig, SchedulerConfig
    from engine.engine import Engine
    from engine.engine_request import EngineRequest
    from engine.errors import (
        ContextLengthExceededError,
        DuplicateRequestError,
        EngineError,
        InvalidRequestError,
        SLOUnattainableError,
    )
    from engine.llm import LLM, Completion
    from engine.lora.errors import AdapterError
    from engine.lora.request import LoRARequest
    from engine.models.check import check_model
    from engine.models.spec import UnsupportedModelError
    from engine.prompt_checks import check_context, check_prompt
    from engine.request import RequestOutput, SamplingParams, TokenLogprob
    from engine.scheduler.load import SLOLoad, predict_ttft
    from engine.scheduler.registry import POLICY_PARTS, parse_policy
    from engine.scheduler.room import Room
    from engine.structured.spec import StructuredSpec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return __all__
