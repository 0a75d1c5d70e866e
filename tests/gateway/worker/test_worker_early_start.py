"""Early starts against real Redis, real sockets and a tiny random-weight engine: a hinted request's
first step runs before its lane entry comes, nothing of it is published until the entry does, and a
hint whose entry does not come (dropped, beaten by another entry, stale) leaves nothing behind."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from prometheus_client import REGISTRY
from worker_lanes import greedy as _greedy
from worker_lanes import make_worker
from worker_lanes import results as _results
from worker_lanes import run_until_done as _run_until_done

from engine import SamplingParams
from gateway.lanes import hints
from gateway.lanes.keys import cancel_key, lane_key, out_key
from gateway.lanes.messages import LaneRequest

pytestmark = pytest.mark.skipif(not hints.supported(), reason="abstract Unix sockets: Linux only")
TIERS = ["priority", "standard", "batch"]
PROMPT = (5, 6, 7, 8)


def _request(model, *, tier="standard", max_tokens=6, prompt=PROMPT) -> LaneRequest:
    return LaneRequest(
        request_id=f"req-{uuid.uuid4().hex[:12]}",
        model=model,
        tier=tier,
        tenant="acme",
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def _hint(sender, inbox, request: LaneRequest, reply_to: str = "") -> None:
    lane = lane_key(request.model, request.tier)
    assert sender.send(inbox.address, hints.start_hint(lane, request.request_id, request.encode(), reply_to))


def _queue(redis, request: LaneRequest) -> None:
    redis.xadd(lane_key(request.model, request.tier), request.encode())


def _starts(worker_id: str, outcome: str) -> float:
    labels = {"worker": worker_id, "outcome": outcome}
    return REGISTRY.get_sample_value("fairlane_lane_early_starts_total", labels) or 0.0


def _dropped_tokens(worker_id: str) -> float:
    labels = {"worker": worker_id}
    return REGISTRY.get_sample_value("fairlane_lane_early_start_dropped_tokens_total", labels) or 0.0


def _tokens(redis, rid) -> list[int]:
    return [t for r in _results(redis, rid) for t in r.token_ids]


@pytest.fixture
def early(tiny_engine_factory, redis, model_name):
    """A worker with an inbox, idle and blocked on its lanes (a long read: only what the test sends
    ends it), and a gateway's sender."""
    inbox = hints.open_inbox()
    worker_id = f"w-{uuid.uuid4().hex[:8]}"
    worker = make_worker(
        tiny_engine_factory(),
        redis,
        model_name,
        TIERS,
        worker_id=worker_id,
        claim_idle_ms=600_000,
        inbox=inbox,
    )
    worker.run_once()  # the first take, with its look for a dead worker's entries, finds nothing
    worker.lane_io.block_ms = 3000
    sender = hints.Sender()
    yield worker, sender
    sender.close()
    inbox.close()


def _in_background(*steps):
    """Run ``steps`` (callables, or seconds to sleep) in a thread; returns the thread, started."""

    def run():
        for step in steps:
            time.sleep(step) if isinstance(step, float) else step()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_hinted_request_runs_before_its_entry_and_publishes_once_the_entry_comes(
    early, redis, tiny_engine_factory
):
    worker, sender = early
    engine = worker.engine
    request = _request(worker.model)
    before = {}

    def look():  # the entry has not come: the first step ran, nothing was published
        before.update(
            held=engine.num_free_blocks < engine.num_total_blocks,
            published=_results(redis, request.request_id),
        )

    bound = _starts(worker.worker_id, "bound")
    thread = _in_background(
        lambda: _hint(sender, worker.inbox, request), 0.3, look, lambda: _queue(redis, request)
    )
    worker.run_once()
    thread.join()
    assert before == {"held": True, "published": []}
    assert _starts(worker.worker_id, "bound") == bound + 1
    assert request.request_id in worker.inflight and _results(redis, request.request_id)
    _run_until_done(worker, redis, [request.request_id])
    assert _tokens(redis, request.request_id) == _greedy(tiny_engine_factory(), PROMPT, 6)
    assert redis.xlen(lane_key(worker.model, "standard")) == 0  # ACKed and deleted
    assert engine.num_free_blocks == engine.num_total_blocks
    redis.delete(out_key(request.request_id))


def test_a_hinted_requests_last_result_is_echoed_to_its_gateway_with_its_place_in_the_stream(
    early, redis, tiny_engine_factory
):
    worker, sender = early
    gateway_inbox = hints.open_inbox("gateway")
    request = _request(worker.model)
    echoed_early = []
    thread = _in_background(
        lambda: _hint(sender, worker.inbox, request, gateway_inbox.address),
        0.3,
        lambda: echoed_early.extend(gateway_inbox.receive()),  # its step ran: nothing is echoed yet
        lambda: _queue(redis, request),
    )
    try:
        worker.run_once()
        thread.join()
        _run_until_done(worker, redis, [request.request_id])
        echoes = [hints.parse_echo(payload) for payload in gateway_inbox.receive()]
    finally:
        gateway_inbox.close()
    assert echoed_early == []
    published = redis.xrange(out_key(request.request_id))
    assert len(published) > 1  # a result a step: the first step's, then one for each token after
    assert [(e.request_id, e.seq) for e in echoes] == [(request.request_id, len(published) - 1)]
    assert echoes[0].fields == published[-1][1]  # byte for byte
    assert _tokens(redis, request.request_id) == _greedy(tiny_engine_factory(), PROMPT, 6)
    redis.delete(out_key(request.request_id))


def test_a_drop_hint_aborts_the_early_step_and_nothing_is_published(early, redis):
    worker, sender = early
    engine = worker.engine
    request = _request(worker.model)
    dropped, wasted = _starts(worker.worker_id, "dropped"), _dropped_tokens(worker.worker_id)
    thread = _in_background(
        lambda: _hint(sender, worker.inbox, request),
        0.2,
        lambda: sender.send(worker.inbox.address, hints.drop_hint(request.request_id)),
        0.2,
        lambda: _queue(redis, _request(worker.model, max_tokens=1)),  # ends the read
    )
    worker.run_once()
    thread.join()
    assert _starts(worker.worker_id, "dropped") == dropped + 1
    assert _dropped_tokens(worker.worker_id) == wasted + len(PROMPT)  # its prefill, run for nothing
    assert not redis.exists(out_key(request.request_id))
    _run_until_done(worker, redis, list(worker.inflight))
    assert engine.num_free_blocks == engine.num_total_blocks and not engine.has_unfinished()


def test_an_early_step_whose_entry_does_not_come_first_is_aborted_and_its_entry_runs_later(
    early, redis, tiny_engine_factory
):
    worker, sender = early
    hinted, other = _request(worker.model), _request(worker.model, prompt=(9, 10, 11), max_tokens=4)
    dropped, bound = _starts(worker.worker_id, "dropped"), _starts(worker.worker_id, "bound")
    thread = _in_background(lambda: _hint(sender, worker.inbox, hinted), 0.2, lambda: _queue(redis, other))
    worker.run_once()
    thread.join()
    assert _starts(worker.worker_id, "dropped") == dropped + 1
    assert hinted.request_id not in worker.inflight and other.request_id in worker.inflight
    assert not redis.exists(out_key(hinted.request_id))
    _queue(redis, hinted)  # its admission was only slower: it runs the usual way, from its first step
    _run_until_done(worker, redis, [hinted.request_id, other.request_id])
    reference = tiny_engine_factory()
    assert _tokens(redis, hinted.request_id) == _greedy(reference, PROMPT, 6)
    assert _tokens(redis, other.request_id) == _greedy(reference, (9, 10, 11), 4)
    assert _starts(worker.worker_id, "bound") == bound
    assert worker.engine.num_free_blocks == worker.engine.num_total_blocks
    redis.delete(out_key(hinted.request_id), out_key(other.request_id))


def test_a_stale_hint_of_a_request_already_run_is_ignored(early, redis):
    worker, sender = early
    served = _request(worker.model, max_tokens=2)
    _queue(redis, served)
    _run_until_done(worker, redis, [served.request_id])
    published = _results(redis, served.request_id)
    counts = _starts(worker.worker_id, "bound"), _starts(worker.worker_id, "dropped")
    nxt = _request(worker.model, max_tokens=1)
    thread = _in_background(lambda: _hint(sender, worker.inbox, served), 0.2, lambda: _queue(redis, nxt))
    worker.run_once()
    thread.join()
    assert (_starts(worker.worker_id, "bound"), _starts(worker.worker_id, "dropped")) == counts
    assert _results(redis, served.request_id) == published
    assert _results(redis, nxt.request_id)[-1].done
    redis.delete(out_key(served.request_id), out_key(nxt.request_id))


def test_hints_of_another_model_or_a_long_prompt_are_not_started(early, redis, model_name):
    worker, sender = early
    foreign = _request("another-model")
    long = _request(worker.model, prompt=tuple(range(1, hints.MAX_PROMPT_TOKENS + 2)), max_tokens=1)
    ends = _request(worker.model, max_tokens=1)
    thread = _in_background(
        lambda: _hint(sender, worker.inbox, foreign),
        lambda: _hint(sender, worker.inbox, long),
        0.2,
        lambda: _queue(redis, ends),
    )
    counts = _starts(worker.worker_id, "bound"), _starts(worker.worker_id, "dropped")
    worker.run_once()
    thread.join()
    assert (_starts(worker.worker_id, "bound"), _starts(worker.worker_id, "dropped")) == counts
    assert _results(redis, ends.request_id)[-1].done
    redis.delete(out_key(ends.request_id))


def test_a_request_cancelled_before_its_entry_came_is_aborted_by_the_first_publish(early, redis):
    worker, sender = early
    request = _request(worker.model, max_tokens=8)
    thread = _in_background(
        lambda: _hint(sender, worker.inbox, request),
        0.2,
        lambda: redis.set(cancel_key(request.request_id), b"1", ex=60),
        lambda: _queue(redis, request),
    )
    worker.run_once()
    thread.join()
    _run_until_done(worker, redis, [request.request_id], max_iters=5)
    last = _results(redis, request.request_id)[-1]
    assert last.done and last.finish_reason == "abort"
    assert worker.inflight == {} and worker.engine.num_free_blocks == worker.engine.num_total_blocks
    redis.delete(out_key(request.request_id), cancel_key(request.request_id))


def test_an_idle_worker_with_an_inbox_sends_redis_what_one_without_sends(early, redis, model_name):
    """The inbox changes nothing on the wire: one blocking XREADGROUP and the lanes' XLENs a wait."""
    worker, _sender = early
    worker.lane_io.block_ms = 10
    marker = f"end-of-{model_name}"
    with redis.monitor() as monitor:
        worker.run_once()
        redis.echo(marker)
        seen = []
        while marker not in (command := monitor.next_command())["command"]:
            if command["client_type"] != "lua" and model_name in command["command"]:
                seen.append(command["command"].split()[0])
    assert seen == ["XREADGROUP", "XLEN", "XLEN", "XLEN"]


def test_the_heartbeat_tells_gateways_where_the_inbox_is(early, redis):
    from gateway.lanes.keys import WORKER_INBOX_FIELD, worker_info_key
    from gateway.worker.heartbeat import beat

    worker, _sender = early
    beat(worker, redis)
    inbox = redis.hget(worker_info_key(worker.model, worker.worker_id), WORKER_INBOX_FIELD)
    assert inbox.decode() == worker.inbox.address
