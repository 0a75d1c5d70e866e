"""Request state and sampling parameters. Plain Python: no torch."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from engine.codes import FinishReason
from engine.errors import InvalidRequestError
from engine.structured.spec import StructuredSpec


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def _seq(value: Any, name: str, kind: type) -> tuple:
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


MAX_LOGPROBS = 20  # top log-probabilities a row may ask for (OpenAI's chat limit)
MAX_N = 128  # choices of one request (OpenAI's limit)


def _num(value: Any, name: str, low: float, high: float, *, open_low: bool = False) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not (low < value if open_low else low <= value)
        or not value <= high
    ):
        bounds = f"({low}, {high}]" if open_low else f"[{low}, {high}]"
        raise InvalidRequestError(f"{name} must be a number in {bounds}, got {value!r}", param=name)
    return float(value)


def _opt_count(value: Any, name: str, high: int) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise InvalidRequestError(f"{name} must be an integer in [0, {high}], got {value!r}", param=name)
    return value


def _bias(value: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs, from a mapping or pairs; ids as ints or digit strings."""
    if not value:
        return ()
    items = value.items() if isinstance(value, dict) else value
    pairs: dict[int, float] = {}
    try:
        for token, bias in items:
            if isinstance(token, str) and token.strip().isdigit():
                token = int(token)
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise InvalidRequestError(
                    f"logit_bias keys must be token ids, got {token!r}", param="logit_bias"
                )
            pairs[token] = _num(bias, "logit_bias", -100, 100)
    except (TypeError, ValueError):
        raise InvalidRequestError("logit_bias must map token ids to numbers", param="logit_bias") from None
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 is greedy.

    Logit processing, in this order, before temperature/top-k/top-p (engine/logits_processing.py):
    min_tokens masks the EOS and stop tokens until that many tokens are out; logit_bias adds to a
    token's logit (-100 bans it, +100 forces it); repetition_penalty (HF's: divides a positive
    logit, multiplies a negative one, of every token in prompt + output); frequency_penalty and
    presence_penalty (OpenAI's: logit -= count * frequency + (count > 0) * presence, counts over
    the output). logprobs: how many top log-probabilities to return with each output token (0: the
    chosen token's only; None: none); prompt_logprobs: the same for the prompt's tokens. Both are
    of the model's raw distribution: log_softmax of the fp32 logits, before any processing.
    max_tokens 0 is allowed with prompt_logprobs: the prompt is scored, nothing is generated.
    n: choices of the prompt, each its own sequence; choice i > 0 starts once choice 0's prompt
    is in the KV cache and shares its full blocks (seeded: choice i draws with seed + i; the
    prompt's logprobs come with choice 0).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: all tokens
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]); a dict is accepted
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured: StructuredSpec | None = None  # a JSON schema, regex or grammar the output must match

    def __post_init__(self) -> None:
        object.__setattr__(self, "structured", StructuredSpec.coerce(self.structured))
        object.__setattr__(self, "stop", _seq(self.stop, "stop", str))
        object.__setattr__(self, "stop_token_ids", _seq(self.stop_token_ids, "stop_token_ids", int))
        object.__setattr__(self, "logit_bias", _bias(self.logit_bias))
        object.__setattr__(self, "presence_penalty", _num(self.presence_penalty, "presence_penalty", -2, 2))
        object.__setattr__(
            self, "frequency_penalty", _num(self.frequency_penalty, "frequency_penalty", -2, 2)
        )
        object.__setattr__(
            self,
            "repetition_penalty",
            _num(self.repetition_penalty, "repetition_penalty", 0, 100, open_low=True),
        )
        object.__setattr__(self, "logprobs", _opt_count(self.logprobs, "logprobs", MAX_LOGPROBS))
        object.__setattr__(
            self, "prompt_logprobs", _opt_count(self.prompt_logprobs, "prompt_logprobs", MAX_LOGPROBS)
        )
        scoring = self.prompt_logprobs is not None
        if (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 0
            or self.max_tokens == 0
            and not scoring
        ):
            raise InvalidRequestError(
                f"max_tokens must be a positive integer (0 only with prompt_logprobs), "
                f"got {self.max_tokens!r}",
                param="max_tokens",
            )
        if (
            not isinstance(self.min_tokens, int)
            or isinstance(self.min_tokens, bool)
            or not 0 <= self.min_tokens <= self.max_tokens
        ):
            raise InvalidRequestError(
                f"min_tokens must be an integer in [0, max_tokens], got {self.min_tokens!r}",
                param="min_tokens",
            )
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 100:
            raise InvalidRequestError(
                f"temperature must be in [0, 100], got {self.temperature!r}", param="temperature"
            )
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", param="top_p")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(
                f"top_k must be a non-negative integer, got {self.top_k!r}", param="top_k"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise InvalidRequestError(f"seed must be an integer, got {self.seed!r}", param="seed")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= MAX_N:
            raise InvalidRequestError(f"n must be an integer in [1, {MAX_N}], got {self.n!r}", param="n")
        if self.n > 1 and self.max_tokens == 0:
            raise InvalidRequestError(
                "n > 1 needs max_tokens > 0: scoring a prompt has one answer", param="n"
            )
        if self.n > 1 and self.structured is not None:
            raise InvalidRequestError(
                "n > 1 (or best_of) with a structured output constraint is not supported: send n requests",
                param="n",
            )
        if any(s == "" for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", param="stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty) or self.repetition_penalty != 1.0

    @property
    def processes_logits(self) -> bool:
        """Does anything change this row's logits before sampling (penalties, bias, min_tokens)?"""
        return self.has_penalties or bool(self.logit_bias) or self.min_tokens > 0


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability and, when asked for, the most likely tokens at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


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
    group: str | None = None  # choice i > 0 of request `group` (params.n > 1); None: the request itself
    index: int = 0  # its choice index
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # the sliding layers' blocks where a model mixes sliding and full layers (engine/kv_groups.py)
    sliding_block_table: list[int] = field(default_factory=list)
    num_resumed_tokens: int = 0  # output tokens given at add time (a dead worker's), not generated here
    first_token_time: float | None = None
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at the last admission
    # params.prompt_logprobs: the prompt's logprobs so far (the first token has none), filled from
    # the prefill's logits; handed out once, with the first output
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=lambda: [None])
    prompt_logprobs_sent: bool = False
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified for it, and those accepted
    num_accepted_tokens: int = 0
    # speculative decoding's policy (engine/speculative/policy.py): a running average of the share of
    # its drafts kept (optimistic at first), and its decode steps without drafts since it fell
    # below min_acceptance; and how many drafts it may take next (0: num_speculative_tokens)
    draft_acceptance: float = 1.0
    draft_skipped: int = 0
    draft_limit: int = 0
    # a drafter's own record of the sequence (prompt lookup: its n-gram index), None until it drafts
    draft_index: object = field(default=None, repr=False, compare=False)
    events: list[SeqEvent] = field(default_factory=list)  # not yet handed out in a RequestOutput

    def record(self, name: str, **attrs: object) -> None:
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

    @property
    def needs_prompt_logits(self) -> bool:
        """Does the prefill still owe this sequence prompt logprobs (so every prompt position needs
        its logits, and no prompt block may come from the prefix cache)?"""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens


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
    logprobs: list[TokenLogprob] | None = None  # one per new token, when params.logprobs is set
    prompt_logprobs: list[TokenLogprob | None] | None = (
        None  # the prompt's (first: None), once, with the first output
    )
    num_cached_tokens: int = 0  # prompt tokens that came from the prefix cache
    index: int = 0  # which choice (SamplingParams.n); `finished` is this choice's end
    # speculative decoding, this choice so far: draft tokens verified, and those accepted
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    done: bool | None = None  # is the whole request over (every choice finished)? None: as `finished`

    def __post_init__(self) -> None:
        if self.done is None:
            self.done = self.finished
