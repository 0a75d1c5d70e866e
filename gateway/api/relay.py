"""Relay a running request's results from its lanes' result streams to the response, counting
tokens and timing as they pass, and close it: cancel what is unfinished and settle its outcome.

A relay that fails ends with an error, never silently: no result for ``stream_idle_timeout_s``
(``TIMED_OUT``, or ``WORKER_LOST`` when no live worker is left to resume it), Redis unreachable or
the request lost by a restarted Redis (``REDIS_LOST``, 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace

import anyio
from opentelemetry.trace import Span
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engine import ErrorCode
from gateway.api.errors import (
    NO_WORKER_RETRY_S,
    GatewayError,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    SLOUnattainable,
    engine_timeout,
    queue_lost,
    worker_lost,
)
from gateway.api.outcome import RequestOutcome, Status
from gateway.api.settle import Deferred, RequestContext, settle
from gateway.api.state import GatewayState
from gateway.lanes.client import QueueUnavailable, ResultTimeout
from gateway.lanes.messages import LaneResult
from gateway.telemetry import metrics

log = logging.getLogger(__name__)
# The report and the usage record of a sent response wait this long: a client that sends its next
# request as soon as it has a response (one at a time: a chat UI, an agent's loop) finds the event
# loop free, not busy with the last one's bookkeeping (0.15 ms of each round trip at concurrency 1
# on a 2-core EPYC). Their latency is the one at settlement; the request's span ends at its last byte.
AFTER_RESPONSE_DELAY_S = 0.002


def lane_error(
    result: LaneResult, prompt_param: str = "messages", structured_param: str | None = None
) -> GatewayError:
    """The HTTP error of a worker's error result: 503 + retry-after for an SLO refusal and for a
    request its dead worker's successor could not resume (``worker_lost``), else 400.
    ``prompt_param``, ``structured_param``: the request fields the prompt and the output constraint
    came in, named in place of the engine's "prompt" and "response_format"."""
    if result.error_code == ErrorCode.SLO_UNATTAINABLE:
        return SLOUnattainable(
            result.error_message or "The request cannot meet its latency target now.",
            retry_after_s=result.retry_after_s or 1.0,
        )
    if result.error_code == ErrorCode.WORKER_LOST:  # an n > 1 request its dead worker had started
        return ServiceUnavailable(
            result.error_message or "The engine worker running this request stopped; retry it.",
            code=ErrorCode.WORKER_LOST.value,
            headers={"retry-after": str(NO_WORKER_RETRY_S)},
        )
    if result.error_code == ErrorCode.MODEL_NOT_FOUND:  # its adapter was deleted while it waited
        return NotFound(
            result.error_message or "The model does not exist.", param="model", code=ErrorCode.MODEL_NOT_FOUND
        )
    param = result.error_param
    if param == "prompt":
        param = prompt_param
    elif param == "response_format" and structured_param is not None:
        param = structured_param
    return InvalidRequest(
        result.error_message or "The engine refused the request.", param=param, code=result.error_code
    )


async def relay_failure(
    state: GatewayState, exc: ResultTimeout | QueueUnavailable
) -> tuple[Status, GatewayError]:
    """The status and the client's error of a relay that failed with ``exc``. No result in time
    while no live worker serves the model: its worker was lost (and none was left to resume it)."""
    if isinstance(exc, QueueUnavailable):
        return Status.REDIS_LOST, queue_lost(exc)
    model = state.settings.model_name  # the base model: its workers run its adapters too
    try:
        alive = await state.lanes.has_worker(model, fresh=True)
    except Exception:  # Redis answers the relay but not this: say what we know
        alive = True
    if alive:
        return Status.TIMED_OUT, engine_timeout(exc)
    return Status.WORKER_LOST, worker_lost(model)


def tally(results: Iterable[LaneResult], choice_tokens: dict[int, int]) -> int | None:
    """Add the output tokens ``results`` report to ``choice_tokens`` (choice index -> tokens: the
    most any result says, as each result counts its choice's tokens so far); the prompt tokens they
    report, or None when none of them ran (error results only, or none)."""
    prompt: int | None = None
    for result in results:
        if result.kind == "error":
            continue
        prompt = max(prompt or 0, result.num_prompt_tokens)
        choice_tokens[result.index] = max(choice_tokens.get(result.index, 0), result.num_output_tokens)
    return prompt


async def read_published(context: RequestContext, request_ids: list[str]) -> list[list[LaneResult]] | None:
    """Every result the workers published so far for each of a request's engine requests, in one
    round trip; None when Redis does not answer (the request is then charged as relayed)."""
    try:
        return await context.state.lanes.published(request_ids)
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        log.warning("request %s: charged as relayed (redis unavailable: %s)", context.request_id, exc)
        return None


def _being_cancelled() -> bool:
    """Whether the running task is being cancelled (uvicorn cancels the requests still running
    when serve's drain_timeout_s runs out)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def refusal_status(result: LaneResult) -> Status:
    """The status of a request a worker refused with the error result ``result``."""
    if result.error_code == ErrorCode.WORKER_LOST:
        return Status.WORKER_LOST
    return Status.SLO_REFUSED if result.error_code == ErrorCode.SLO_UNATTAINABLE else Status.WORKER_REFUSED


@dataclass
class Relay:
    """One engine request of a Generation (one prompt): its lane results and its own counts.

    Its choices are ``offset .. offset + n - 1`` of the response (OpenAI's ``prompt_index * n + choice``).
    """

    request_id: str
    offset: int
    first: LaneResult | None
    results: AsyncIterator[LaneResult | None]
    prompt_tokens: int
    choice_tokens: dict[int, int] = field(default_factory=dict)  # output tokens per choice index
    cached_tokens: int = 0  # prompt tokens the worker found in its prefix cache
    prompt_logprobs: tuple | None = None  # the prompt's TokenLogprobs (first None), when asked for
    done: bool = False
    ran: bool = False  # a result (not an error) came back: its prompt was computed
    quota_settled: bool = False  # its last result says the worker settled the request's quota

    @property
    def completion_tokens(self) -> int:
        return sum(self.choice_tokens.values())

    def count_published(self, results: list[LaneResult]) -> None:
        """Count what its result stream holds beyond what the relay read (a prompt that ran ahead
        of the relay while the client left or another prompt failed): it ran, and is charged."""
        prompt = tally(results, self.choice_tokens)
        if prompt is not None:
            self.ran = True
            self.prompt_tokens = prompt or self.prompt_tokens


@dataclass
class Generation:
    """One HTTP request's generation once its first results are back: one engine request per
    prompt (``relays``: one, except for a completions request with several prompts)."""

    context: RequestContext
    relays: list[Relay]
    relay_span: Span | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None  # the last choice's, once every relay is done
    failure: Status | None = None  # why the relay stopped before the end
    closed: bool = False
    deferred: Deferred | None = None  # report and usage record, left by close(after_response=True)
    finished: bool = False

    @property
    def state(self) -> GatewayState:
        return self.context.state

    @property
    def request_id(self) -> str:
        return self.context.request_id

    @property
    def model(self) -> str:
        return self.context.model

    @property
    def tier(self) -> str:
        return self.context.tier

    @property
    def headers(self) -> dict[str, str]:
        """The quota's x-ratelimit-* headers, sent with the response."""
        return {} if self.context.admission is None else self.context.admission.headers

    @property
    def done(self) -> bool:
        return all(relay.done for relay in self.relays)

    @property
    def in_hand(self) -> bool:
        """Every prompt's first result was its last (e.g. ``max_tokens`` 1): the whole output is
        here before the relay starts, and there is nothing to wait for."""
        return all(relay.first is not None and relay.first.done for relay in self.relays)

    @property
    def prompt_tokens(self) -> int:
        return sum(relay.prompt_tokens for relay in self.relays)

    @property
    def completion_tokens(self) -> int:  # n > 1: every choice's tokens; the prompt counts once
        return sum(relay.completion_tokens for relay in self.relays)

    @property
    def cached_tokens(self) -> int:
        return sum(relay.cached_tokens for relay in self.relays)

    def prompt_index(self, index: int) -> int:
        """The position in the request's prompts of the prompt that choice ``index`` continues."""
        return next(i for i in range(len(self.relays) - 1, -1, -1) if self.relays[i].offset <= index)

    def prompt_logprobs(self, index: int) -> tuple | None:
        """The prompt logprobs (first None) of the prompt that choice ``index`` continues, when asked for."""
        return self.relays[self.prompt_index(index)].prompt_logprobs

    async def __aiter__(self) -> AsyncIterator[LaneResult | None]:
        """Every result of every prompt, the first ones included, its ``index`` that of the
        response's choice, and ``None`` as a keep-alive while none comes; records token counts and
        token timing as they pass. Several prompts: their results in the order they come."""
        if len(self.relays) == 1:
            async for result in self._relay(self.relays[0]):
                yield result
            return
        streams = [self._relay(relay).__aiter__() for relay in self.relays]
        pending = {asyncio.ensure_future(anext(stream)): i for i, stream in enumerate(streams)}
        try:
            while pending:
                ready, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(ready, key=pending.__getitem__):
                    i = pending.pop(task)
                    try:
                        result = task.result()
                    except StopAsyncIteration:
                        continue
                    pending[asyncio.ensure_future(anext(streams[i]))] = i
                    yield result
        finally:
            for task in pending:
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*pending, return_exceptions=True)
                for stream in streams:
                    with contextlib.suppress(Exception):
                        await stream.aclose()

    async def _relay(self, relay: Relay) -> AsyncIterator[LaneResult | None]:
        try:
            result, relay.first = relay.first, None
            while True:
                if result is None:
                    yield None
                    result = await anext(relay.results)
                    continue
                if result.kind == "error":  # e.g. refused at a step start after a worker took it over
                    relay.done = True
                    self.failure = refusal_status(result)
                    raise lane_error(result)
                self._count(relay, result)
                yield replace(result, index=relay.offset + result.index) if relay.offset else result
                if result.done:
                    return
                result = await anext(relay.results)
        except (ResultTimeout, QueueUnavailable) as exc:
            self.failure, error = await relay_failure(self.state, exc)
            raise error from exc

    def _count(self, relay: Relay, result: LaneResult) -> None:
        relay.ran = True
        if result.token_ids:
            now = time.monotonic()
            if self.first_token_at is None:
                self.first_token_at = now
            elif self.last_token_at is not None:
                metrics.INTER_TOKEN.labels(self.tier).observe(
                    (now - self.last_token_at) / len(result.token_ids)
                )
            self.last_token_at = now
        relay.prompt_tokens = result.num_prompt_tokens or relay.prompt_tokens
        relay.choice_tokens[result.index] = max(
            relay.choice_tokens.get(result.index, 0), result.num_output_tokens
        )
        if result.index == 0:  # the prompt's own (choices > 0 share its blocks by design)
            relay.cached_tokens = max(relay.cached_tokens, result.num_cached_tokens)
        if result.prompt_logprobs is not None and relay.prompt_logprobs is None:
            relay.prompt_logprobs = result.prompt_logprobs
        if result.done:
            relay.done = True
            relay.quota_settled = result.quota_settled
            if self.done:
                self.finish_reason = result.finish_reason

    def outcome(self) -> RequestOutcome:
        """How the request ended, as far as the relay saw it."""
        if self.failure is not None:
            status = self.failure
        elif self.done:
            status = Status.FINISHED
        else:
            status = Status.CANCELLED_AFTER_FIRST_TOKEN
        return RequestOutcome(
            status,
            prompt_tokens=sum(relay.prompt_tokens for relay in self.relays if relay.ran),
            completion_tokens=self.completion_tokens,
            finish_reason=self.finish_reason,
            first_token_at=self.first_token_at,
            # one prompt only: a worker settles a request that is its own (admit.py)
            quota_settled=status is Status.FINISHED
            and len(self.relays) == 1
            and self.relays[0].quota_settled,
        )

    async def close(self, *, after_response: bool = False) -> None:
        """Cancel what is unfinished, settle the outcome, drop the result streams and record the
        usage (shielded: runs even when the client has gone and this task is being cancelled);
        once. ``after_response``: leave what the response does not wait for (the result streams'
        deletion, the report and the usage record) to ``finish``, which the caller runs once it is
        sent."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            lanes = self.state.lanes
            unfinished = [relay for relay in self.relays if not relay.done]
            for relay in self.relays if self.failure is Status.REDIS_LOST else unfinished:
                lanes.cancel_soon(relay.request_id)
            if unfinished and self.failure is not Status.REDIS_LOST:
                await self._count_published(unfinished)
            outcome = self.outcome()
            if self.relay_span is not None:
                self.relay_span.set_attribute("gen_ai.usage.output_tokens", self.completion_tokens)
                self.relay_span.end()
            self.deferred = await settle(self.context, outcome, defer=True)
        if not after_response or _being_cancelled():  # cancelled (serve's drain ran out): no
            await self.finish()  # response will be sent to run the usage record after it

    async def _count_published(self, relays: list[Relay]) -> None:
        """Charge what the workers published for unfinished prompts that their relays did not read:
        one round trip (a result published after it, as the cancel reaches the worker, is not)."""
        published = await read_published(self.context, [relay.request_id for relay in relays])
        for relay, results in zip(relays, published or ()):
            relay.count_published(results)

    async def end(self) -> None:
        """``close`` and ``finish``, whichever have not run: everything, now."""
        await self.close()
        await self.finish()

    async def after_response(self) -> None:
        """``end``, ``AFTER_RESPONSE_DELAY_S`` after the response was sent (its background task)."""
        await asyncio.sleep(AFTER_RESPONSE_DELAY_S)
        await self.end()

    async def finish(self) -> None:
        """What ``close`` left: the result streams to the lanes' next discard, the report and the
        usage record; once."""
        if self.finished:
            return
        self.finished = True
        with anyio.CancelScope(shield=True):
            for relay in self.relays:
                self.state.lanes.discard_soon(relay.request_id)
            if self.deferred is not None:
                await self.deferred()
