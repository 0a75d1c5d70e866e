"""The first results of a generation's prompts, waited for together before a response starts
(gateway/api/admit.py), and the outcome of a request that ends before them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.api.errors import GatewayError, SLOUnattainable
from gateway.api.outcome import RequestOutcome, Status
from gateway.api.relay import relay_failure, tally
from gateway.api.state import GatewayState
from gateway.lanes.client import QueueUnavailable, ResultTimeout
from gateway.lanes.messages import LaneResult

# How often a request waiting for its first results, or for the rest of a response that is not
# streamed, asks whether its client is still there.
DISCONNECT_POLL_S = 0.25


class ClientGone(Exception):
    """The client disconnected while the request waited for its first results."""


class Failed(Exception):
    """The relay failed before the first results: its status and the client's error."""

    def __init__(self, status: Status, error: GatewayError) -> None:
        super().__init__(error.message)
        self.status, self.error = status, error


def outcome_before_first_results(
    exc: BaseException, got: dict[int, LaneResult], published: list[list[LaneResult]] | None = None
) -> RequestOutcome:
    """The outcome of a request that ended with ``exc`` before every first result: what ran is
    charged: the first results that came (``got``, by prompt) and, when they could be read, the
    results its prompts' workers ``published`` meanwhile (by prompt; several prompts run at once,
    and those that started first may have run far while the last one waited)."""
    if isinstance(exc, Failed):
        status = exc.status
    elif isinstance(exc, SLOUnattainable):  # refused at the door: nothing was queued
        status = Status.SLO_REFUSED
    elif isinstance(exc, ClientGone) or not isinstance(exc, Exception):  # the client left
        status = Status.CANCELLED_BEFORE_FIRST_TOKEN
    else:
        status = Status.ERROR
    prompt_tokens = completion_tokens = 0
    for i in sorted(set(got) | set(range(len(published or ())))):
        results = [
            *(published[i] if published is not None and i < len(published) else ()),
            *([got[i]] if i in got else ()),
        ]
        choices: dict[int, int] = {}
        prompt = tally(results, choices)
        if prompt is not None:  # this prompt ran
            prompt_tokens += prompt
            completion_tokens += sum(choices.values())
    return RequestOutcome(status, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def result_stream(state: GatewayState, request_id: str, epoch: str) -> AsyncIterator[LaneResult | None]:
    """The results of one engine request, with the replica's timeouts and keep-alives."""
    settings = state.settings
    return state.lanes.results(
        request_id,
        timeout_s=settings.request_timeout_s,
        idle_timeout_s=settings.stream_idle_timeout_s,
        keepalive_s=settings.sse_keepalive_s,
        epoch=epoch,
        model=settings.model_name,  # its workers run its adapters too
    ).__aiter__()


async def first_results(
    state: GatewayState,
    streams: list[AsyncIterator[LaneResult | None]],
    got: dict[int, LaneResult],
    disconnected: Callable[[], Awaitable[bool]] | None = None,
) -> list[LaneResult]:
    """The first result of each stream (keep-alives skipped), waited for together; each lands in
    ``got`` (stream position → result) as it comes, so that a failure knows which prompts ran.
    A relay failure is raised as ``Failed`` (its status and the client's error). ``disconnected``:
    whether the client has gone, asked every DISCONNECT_POLL_S while the results are awaited (a
    request queued behind others, or several prompts, can wait long); ``ClientGone`` when it has."""
    try:
        return await _wait_first_results(streams, got, disconnected)
    except (ResultTimeout, QueueUnavailable) as exc:
        status, error = await relay_failure(state, exc)
        raise Failed(status, error) from exc


async def _wait_first_results(
    streams: list[AsyncIterator[LaneResult | None]],
    got: dict[int, LaneResult],
    disconnected: Callable[[], Awaitable[bool]] | None,
) -> list[LaneResult]:

    async def first(i: int, stream: AsyncIterator[LaneResult | None]) -> LaneResult:
        result = await anext(stream)
        while result is None:  # keep-alives before the first result: a response has not started
            result = await anext(stream)
        got[i] = result
        return result

    if len(streams) == 1 and disconnected is None:
        return [await first(0, streams[0])]
    tasks = [asyncio.ensure_future(first(i, stream)) for i, stream in enumerate(streams)]
    waiting = tasks[0] if len(tasks) == 1 else asyncio.gather(*tasks)
    # The client is asked only once the wait has lasted DISCONNECT_POLL_S (a timer, not a task: the
    # results of most requests come first); when it has gone, the wait is cancelled, not this task.
    gone, loop, checks = False, asyncio.get_running_loop(), set()

    async def check() -> None:
        nonlocal gone, timer
        assert disconnected is not None
        if await disconnected():
            gone = True
            waiting.cancel()
        elif not waiting.done():
            timer = loop.call_later(DISCONNECT_POLL_S, start_check)

    def start_check() -> None:
        task = loop.create_task(check())
        checks.add(task)
        task.add_done_callback(checks.discard)

    timer = loop.call_later(DISCONNECT_POLL_S, start_check) if disconnected is not None else None
    try:
        firsts = await waiting
        return [firsts] if len(tasks) == 1 else list(firsts)
    except asyncio.CancelledError:
        if gone:
            raise ClientGone from None
        raise
    finally:  # one failed, or the client left: the others stop waiting
        if timer is not None:
            timer.cancel()
        for task in (*tasks, *checks):
            task.cancel()
