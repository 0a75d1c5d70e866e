"""``EngineRequest``: everything ``Engine.add`` needs to queue one request, as one typed value.

Plain Python (no torch), so a gateway builds it without loading the model side: the worker turns
a lane entry into one with ``LaneRequest.to_engine()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.lora.request import LoRARequest
from engine.request import SamplingParams


@dataclass(frozen=True)
class EngineRequest:
    """One request for the engine.

    ``priority``: higher runs first (a gateway tier's number); ``arrival_time``: monotonic seconds
    when it arrived (TTFT counts from it; None: now); ``resume_token_ids``: output tokens already
    produced elsewhere (a dead worker's), continued after and counted toward max_tokens;
    ``lora``: an adapter (a PEFT folder or a LoRARequest), None for the base model.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    tenant: str = "default"
    weight: float = 1.0
    priority: int = 0
    arrival_time: float | None = None
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    lora: str | LoRARequest | None = None
    resume_token_ids: tuple[int, ...] = ()
