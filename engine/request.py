"""Request state and sampling parameters. Plain Python: no torch."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError
from engine.structured.spec import StructuredSpec


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"
    SLO_UNATTAINABLE = "slo_unattainable"  # refused before it started: it would miss its TTFT target


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def _seq(value, name: str, kind: type) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidRequestError(f"{name} must be a list of {kind.__name__}", param=name) from None
    for item in items:
        if not isinstance(item, kind) or isinstance(item, bool):
            raise InvalidRequestError(f"{name} must be a list of {kind.__name__}, got {item!r}", param=name)
    return items


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 is greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: all tokens
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    structured: StructuredSpec | None = None  # a JSON schema, regex or grammar the output must match

    def __post_init__(self):
        object.__setattr__(self, "structured", StructuredSpec.coerce(self.structured))
        object.__setattr__(self, "stop", _seq(self.stop, "stop", str))
        object.__setattr__(self, "stop_token_ids", _seq(self.stop_token_ids, "stop_token_ids", int))
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}", param="max_tokens")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 100:
            raise InvalidRequestError(f"temperature must be in [0, 100], got {self.temperature!r}", param="temperature")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", param="top_p")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be a non-negative integer, got {self.top_k!r}", param="top_k")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise InvalidRequestError(f"seed must be an integer, got {self.seed!r}", param="seed")
        if self.n != 1:
            raise InvalidRequestError(f"only n=1 is supported, got n={self.n!r}", param="n")
        if any(s == "" for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", param="stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class SeqEvent:
    """Something that happened to a request inside the engine, for tracing: the worker turns these
    into span events, an offline caller may ignore them. A handful per request, none per decode.

    name: admitted | resumed | prefill_chunk | first_token | preempted | finished | aborted |
    slo_refused; time: unix seconds (time.time()); attrs: plain str/int/float values, e.g.
    preempted/resumed {"mode": "recompute" | "swap"}, prefill_chunk {"tokens": n, "start": first position}.
    """

    name: str
    time: float
    attrs: dict = field(default_factory=dict)


@dataclass
class Sequence:
    """One request's tokens and progress. token_ids = prompt + output; KV holds the first
    num_computed_tokens of them, in the blocks listed by block_table."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    tenant: str = "default"
    weight: float = 1.0
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    lora: str | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_resumed_tokens: int = 0  # output tokens given at add time (a dead worker's), not generated here
    first_token_time: float | None = None
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at the last admission
    events: list[SeqEvent] = field(default_factory=list)  # not yet handed out in a RequestOutput

    def record(self, name: str, **attrs) -> None:
        """Note an event (SeqEvent) now."""
        self.events.append(SeqEvent(name, time.time(), attrs))

    def take_events(self) -> list[SeqEvent]:
        """The events recorded since the last call, oldest first."""
        events, self.events = self.events, []
        return events

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


@dataclass
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: Exception | None = None  # why a request was refused (an EngineError, e.g. SLOUnattainableError)
    events: list[SeqEvent] = field(default_factory=list)  # what happened to it since its last output
