"""fairlane's inference engine: paged KV cache, continuous batching, our own Llama forward.

Public API (other packages import only these names):
    Engine, EngineConfig, LLM, SamplingParams, RequestOutput, SLOLoad, errors.
"""
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.engine import Engine
from engine.errors import (ContextLengthExceededError, DuplicateRequestError, EngineError, InvalidRequestError,
                           SLOUnattainableError)
from engine.llm import LLM, Completion
from engine.request import FinishReason, RequestOutput, SamplingParams
from engine.scheduler import SLOLoad

__all__ = [
    "CacheConfig",
    "Completion",
    "ContextLengthExceededError",
    "DuplicateRequestError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "FinishReason",
    "InvalidRequestError",
    "LLM",
    "RequestOutput",
    "SLOLoad",
    "SLOUnattainableError",
    "SamplingParams",
    "SchedulerConfig",
]
