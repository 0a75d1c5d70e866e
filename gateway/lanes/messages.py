"""Typed, versioned messages between gateways and workers, encoded in one place.

A lane entry carries one ``LaneRequest``; a request's result stream carries ``LaneResult``s.
On the wire each is a Redis stream entry ``{"v": <version>, "body": <json>}``; a reader refuses
a version it does not know instead of guessing. A worker's ``LoadReport`` is one field of the
hash ``load:{model}``, the same two keys as one JSON string. The engine's own types travel
inside them (``SamplingParams``, ``SLOLoad``: torch-free modules of the engine), never copies.
orjson serializes the dataclasses directly (no ``asdict`` copy; ~3 µs a request instead of ~90 µs
with the json module), to the same JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from engine import EngineError, EngineRequest, LoRARequest, SamplingParams, SLOLoad, TokenLogprob

MESSAGE_VERSION = 2
HEX = frozenset("0123456789abcdef")


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
        raise MessageError(
            f"message version {version} is not supported (this reader knows {MESSAGE_VERSION})"
        )
    return body


def _encode(message: Any) -> dict[str, str]:
    return {"v": str(MESSAGE_VERSION), "body": orjson.dumps(message).decode()}


@dataclass(frozen=True)
class LaneAdapter:
    """The LoRA adapter a request runs with: its row and its files' digest in the adapter store."""

    id: int
    name: str
    sha256: str  # 64 lowercase hex digits: the adapter store's folder

    def __post_init__(self) -> None:
        if not (isinstance(self.sha256, str) and len(self.sha256) == 64 and set(self.sha256) <= HEX):
            raise ValueError(f"not an adapter digest: {self.sha256!r}")


@dataclass(frozen=True)
class LaneRequest:
    """One generation request waiting in lanes:{model}:{tier}. ``sampling`` is the engine's own
    SamplingParams, built and checked once by the gateway and checked again when decoded."""

    request_id: str
    model: str
    tier: str
    tenant: str  # the tenant's database id: the engine's fairness key, stable when the tenant is renamed
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    weight: float = 1.0
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    traceparent: str | None = None  # W3C trace context of the gateway span
    enqueued_at: float = field(default_factory=time.time)
    lora: LaneAdapter | None = None  # None: the base model

    encode = _encode

    def to_engine(
        self,
        *,
        priority: int,
        arrival_time: float | None = None,
        resume_token_ids: tuple[int, ...] = (),
        lora: LoRARequest | None = None,
    ) -> EngineRequest:
        """The engine's request: ``priority`` of its lane's tier, ``arrival_time`` (monotonic) when
        it entered the lane, ``resume_token_ids`` already streamed by a dead worker (a resumed
        request's first token went out long ago: only its TPOT target still applies), ``lora``: its
        adapter's folder on this worker."""
        return EngineRequest(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling=self.sampling,
            tenant=self.tenant,
            weight=self.weight,
            priority=priority,
            arrival_time=arrival_time,
            ttft_target_s=None if resume_token_ids else self.ttft_target_s,
            tpot_target_s=self.tpot_target_s,
            lora=lora,
            resume_token_ids=resume_token_ids,
        )

    @classmethod
    def decode(cls, fields: dict[Any, Any]) -> LaneRequest:
        body = _decode_fields(fields)
        try:
            sampling = SamplingParams(**body.pop("sampling"))
            body["prompt_token_ids"] = tuple(body["prompt_token_ids"])
            if body.get("lora") is not None:
                body["lora"] = LaneAdapter(**body["lora"])
            return cls(sampling=sampling, **body)
        except (KeyError, TypeError, ValueError, EngineError) as exc:
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
    done: bool = False  # the whole request is over (its last result), as RequestOutput.done
    finish_reason: str | None = None  # this choice ended (as RequestOutput.finished + its reason)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    worker: str = ""
    error_message: str | None = None
    error_param: str | None = None
    error_code: str | None = None
    retry_after_s: float | None = None  # errors worth retrying (slo_unattainable): when
    at: float = field(default_factory=time.time)
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token of token_ids (SamplingParams.logprobs)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # once, in the first result
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # n > 1: the choice these tokens belong to (offset and num_output_tokens are that choice's); its
    # end is a finish_reason, `done` the end of the whole request (its last choice)
    index: int = 0
    # the last result: the worker settled the request's quota in the transaction that published it,
    # charging num_prompt_tokens + num_output_tokens (quotas/settlement.py)
    quota_settled: bool = False

    encode = _encode

    @staticmethod
    def is_last(fields: dict[Any, Any]) -> bool:
        """Whether an encoded result is its request's last (``done``), from its body's JSON alone
        (no result built); an unreadable entry is not."""
        try:
            return _decode_fields(fields).get("done") is True
        except MessageError:
            return False

    @classmethod
    def decode(cls, fields: dict[Any, Any]) -> LaneResult:
        body = _decode_fields(fields)
        try:
            body["token_ids"] = tuple(body.get("token_ids", ()))
            for name in ("logprobs", "prompt_logprobs"):
                if body.get(name) is not None:
                    body[name] = tuple(
                        None
                        if x is None
                        else TokenLogprob(x["token_id"], x["logprob"], tuple(map(tuple, x["top"])))
                        for x in body[name]
                    )
            result = cls(**body)
        except (KeyError, TypeError) as exc:
            raise MessageError(f"malformed lane result: {exc}") from exc
        if result.kind not in cls.KINDS:
            raise MessageError(f"unknown lane result kind {result.kind!r}")
        return result


@dataclass(frozen=True)
class LoadReport:
    """One worker's ``SLOLoad`` (what its SLO-aware engine predicts TTFT from), published every
    ~50 ms in the hash ``load:{model}`` under its id, so that a gateway can refuse at the door
    with the engine's own formula (gateway/api/slo_gate.py); ``at`` is when (unix seconds)."""

    worker: str
    load: SLOLoad
    at: float = field(default_factory=time.time)

    def encode(self) -> str:
        return orjson.dumps({"v": MESSAGE_VERSION, "body": self}, option=orjson.OPT_NON_STR_KEYS).decode()

    @classmethod
    def decode(cls, raw: str | bytes) -> LoadReport:
        try:
            data = orjson.loads(raw)
            version, body = int(data["v"]), data["body"]
        except (KeyError, ValueError, TypeError) as exc:
            raise MessageError(f"malformed worker load: {exc}") from exc
        if version != MESSAGE_VERSION:
            raise MessageError(
                f"message version {version} is not supported (this reader knows {MESSAGE_VERSION})"
            )
        try:
            load = dict(body["load"])
            load["waiting_tokens"] = {int(k): int(v) for k, v in load.get("waiting_tokens", {}).items()}
            return cls(worker=body["worker"], load=SLOLoad(**load), at=float(body["at"]))
        except (KeyError, AttributeError, ValueError, TypeError) as exc:
            raise MessageError(f"malformed worker load: {exc}") from exc
