"""Typed, versioned messages between gateways and workers, encoded in one place.

A lane entry carries one ``LaneRequest``; a request's result stream carries ``LaneResult``s.
On the wire each is a Redis stream entry ``{"v": <version>, "body": <json>}``; a reader refuses
a version it does not know instead of guessing. A worker's ``WorkerLoad`` is one field of the
hash ``load:{model}``, the same two keys as one JSON string. orjson serializes the dataclasses
directly (no ``asdict`` copy; ~3 µs a request instead of ~90 µs with the json module), to the
same JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

MESSAGE_VERSION = 1


class MessageError(ValueError):
    """A stream entry that is not a message this code can read."""


def _decode_fields(fields: dict[Any, Any]) -> dict[str, Any]:
    text = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
    try:
        version = int(text["v"])
        body = orjson.loads(text["body"])  # bytes as Redis returns them, or str
        if not isinstance(body, dict):
            raise TypeError(f"the body is a JSON {type(body).__name__}, not an object")
    except (KeyError, ValueError, TypeError) as exc:
        raise MessageError(f"malformed stream entry: {exc}") from exc
    if version != MESSAGE_VERSION:
        raise MessageError(f"message version {version} is not supported (this reader knows {MESSAGE_VERSION})")
    return body


def _encode(message: Any) -> dict[str, str]:
    return {"v": str(MESSAGE_VERSION), "body": orjson.dumps(message).decode()}


@dataclass(frozen=True)
class SamplingSpec:
    """The engine's SamplingParams as plain data (the gateway never imports the engine)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class LaneRequest:
    """One generation request waiting in lanes:{model}:{tier}."""

    request_id: str
    model: str
    tier: str
    tenant: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec
    weight: float = 1.0
    priority: int = 0  # higher runs first inside the engine
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    lora: str | None = None
    traceparent: str | None = None  # W3C trace context of the gateway span
    enqueued_at: float = field(default_factory=time.time)

    encode = _encode

    @classmethod
    def decode(cls, fields: dict[Any, Any]) -> LaneRequest:
        body = _decode_fields(fields)
        try:
            sampling = body.pop("sampling")
            sampling["stop"] = tuple(sampling.get("stop", ()))
            sampling["stop_token_ids"] = tuple(sampling.get("stop_token_ids", ()))
            body["prompt_token_ids"] = tuple(body["prompt_token_ids"])
            return cls(sampling=SamplingSpec(**sampling), **body)
        except (KeyError, TypeError) as exc:
            raise MessageError(f"malformed lane request: {exc}") from exc


@dataclass(frozen=True)
class LaneResult:
    """New tokens of one request from one engine step, or its error.

    ``offset`` is how many output tokens came before this chunk, so a reader can drop a chunk it
    has already relayed (a claimed request never re-sends tokens, but readers stay safe anyway).
    """

    KINDS: ClassVar[tuple[str, ...]] = ("tokens", "error")

    request_id: str
    kind: str = "tokens"
    token_ids: tuple[int, ...] = ()
    text: str = ""
    offset: int = 0
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    worker: str = ""
    error_message: str | None = None
    error_param: str | None = None
    error_code: str | None = None
    retry_after_s: float | None = None  # errors worth retrying (slo_unattainable): when
    at: float = field(default_factory=time.time)

    encode = _encode

    @classmethod
    def decode(cls, fields: dict[Any, Any]) -> LaneResult:
        body = _decode_fields(fields)
        try:
            body["token_ids"] = tuple(body.get("token_ids", ()))
            result = cls(**body)
        except TypeError as exc:
            raise MessageError(f"malformed lane result: {exc}") from exc
        if result.kind not in cls.KINDS:
            raise MessageError(f"unknown lane result kind {result.kind!r}")
        return result


@dataclass(frozen=True)
class WorkerLoad:
    """What one worker's SLO-aware engine predicts TTFT from (the engine's ``SLOLoad``), so that a
    gateway can refuse at the door without the engine (gateway/slo_gate.py). Published by the
    worker every ~50 ms in the hash ``load:{model}`` under its id; ``at`` is when (unix seconds)."""

    worker: str
    step_s: float  # fitted step cost: seconds per step, per prefill token, per decoding sequence
    prefill_token_s: float
    decode_seq_s: float
    max_num_batched_tokens: int
    max_num_seqs: int
    running: int
    slot_wait_s: float  # at the sequence cap: until the nearest running request ends
    waiting_tokens: dict[int, int] = field(default_factory=dict)  # priority -> prompt tokens to compute
    tiered: bool = False  # only waiting work of the same priority or above is ahead of a request
    at: float = field(default_factory=time.time)

    def encode(self) -> str:
        return orjson.dumps({"v": MESSAGE_VERSION, "body": self}, option=orjson.OPT_NON_STR_KEYS).decode()

    @classmethod
    def decode(cls, raw: str | bytes) -> WorkerLoad:
        try:
            data = orjson.loads(raw)
            version, body = int(data["v"]), data["body"]
        except (KeyError, ValueError, TypeError) as exc:
            raise MessageError(f"malformed worker load: {exc}") from exc
        if version != MESSAGE_VERSION:
            raise MessageError(f"message version {version} is not supported (this reader knows {MESSAGE_VERSION})")
        try:
            body["waiting_tokens"] = {int(k): int(v) for k, v in body.get("waiting_tokens", {}).items()}
            return cls(**body)
        except (AttributeError, ValueError, TypeError) as exc:
            raise MessageError(f"malformed worker load: {exc}") from exc
