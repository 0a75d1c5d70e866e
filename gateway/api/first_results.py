"""The first results of a generation's prompts, waited for together before a response starts
(gateway/api/admit.py), and the outcome of a request that ends before them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gateway.api.errors import GatewayError, SLOUnattainable
from gateway.api.outcome import RequestOutcome, Status
from gateway.api.relay import relay_failure
from gateway.api.state import GatewayState
from gateway.lanes.client import QueueUnavailable, ResultTimeout
from gateway.lanes.messages import LaneResult


class Failed(Exception):
    """The relay failed before the first results: its status and the client's error."""

    def __init__(self, status: Status, error: GatewayError) -> None:
        super().__init__(error.message)
        self.status, self.error = status, error


def outcome_before_first_results(exc: BaseException, got: dict[int, LaneResult]) -> RequestOutcome:
    """The outcome of a request that ended with ``exc`` before every first result: what ran is charged."""
    if isinstance(exc, Failed):
        status = exc.status
    elif isinstance(exc, SLOUnattainable):  # refused at the door: nothing was queued
        status = Status.SLO_REFUSED
    elif isinstance(exc, Exception):
        status = Status.ERROR
    else:  # cancelled: the client left
        status = Status.CANCELLED_BEFORE_FIRST_TOKEN
    ran = [result for result in got.values() if result.kind != "error"]  # one prompt: none
    return RequestOutcome(
        status,
        prompt_tokens=sum(result.num_prompt_tokens for result in ran),
        completion_tokens=sum(result.num_output_tokens for result in ran),
    )


def result_stream(state: GatewayState, request_id: str, epoch: str) -> AsyncIterator[LaneResult | None]:
    """The results of one engine request, with the replica's timeouts and keep-alives."""
    settings = state.settings
    return state.lanes.results(
        request_id,
        timeout_s=settings.request_timeout_s,
        idle_timeout_s=settings.stream_idle_timeout_s,
        keepalive_s=settings.sse_keepalive_s,
        epoch=epoch,
    ).__aiter__()


async def first_results(
    state: GatewayState, streams: list[AsyncIterator[LaneResult | None]], got: dict[int, LaneResult]
) -> list[LaneResult]:
    """The first result of each stream (keep-alives skipped), waited for together; each lands in
    ``got`` (stream position → result) as it comes, so that a failure knows which prompts ran.
    A relay failure is raised as ``Failed`` (its status and the client's error)."""
    try:
        return await _wait_first_results(streams, got)
    except (ResultTimeout, QueueUnavailable) as exc:
        status, error = await relay_failure(state, exc)
        raise Failed(status, error) from exc


async def _wait_first_results(
    streams: list[AsyncIterator[LaneResult | None]], got: dict[int, LaneResult]
) -> list[LaneResult]:

    async def first(i: int, stream: AsyncIterator[LaneResult | None]) -> LaneResult:
        result = await anext(stream)
        while result is None:  # keep-alives before the first result: a response has not started
            result = await anext(stream)
        got[i] = result
        return result

    if len(streams) == 1:
        return [await first(0, streams[0])]
    tasks = [asyncio.ensure_future(first(i, stream)) for i, stream in enumerate(streams)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:  # one failed, or the client left: the others stop waiting
        for task in tasks:
            task.cancel()
