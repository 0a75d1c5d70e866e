"""The worker bridge against real Redis and a tiny random-weight engine."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from worker_lanes import greedy as _greedy
from worker_lanes import make_worker
from worker_lanes import results as _results
from worker_lanes import run_until_done as _run_until_done

from engine import SamplingParams
from gateway.lanes.keys import cancel_key, lane_key, out_key
from gateway.lanes.messages import LaneRequest
from gateway.worker.loop import Worker

TIERS = ["priority", "standard", "batch"]


def _submit(redis, model, tier="standard", *, prompt=(5, 6, 7, 8), max_tokens=8, request_id=None, weight=1.0):
    rid = request_id or f"req-{uuid.uuid4().hex[:12]}"
    req = LaneRequest(
        request_id=rid,
        model=model,
        tier=tier,
        tenant="acme",
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        weight=weight,
    )
    redis.xadd(lane_key(model, tier), req.encode())
    return rid


def _worker(engine, redis, model, **kw):
    return make_worker(engine, redis, model, TIERS, **kw)


def test_requests_complete_and_lanes_are_emptied(tiny_engine_factory, redis, model_name):
    engine = tiny_engine_factory()
    worker = _worker(engine, redis, model_name)
    rids = [_submit(redis, model_name, tier, max_tokens=6) for tier in TIERS]
    _run_until_done(worker, redis, rids)
    expected = _greedy(tiny_engine_factory(), (5, 6, 7, 8), 6)
    for rid in rids:
        results = _results(redis, rid)
        assert [t for r in results for t in r.token_ids] == expected
        assert [r.offset for r in results] == list(range(6))
        assert results[-1].finish_reason == "length" and results[-1].num_output_tokens == 6
        assert redis.ttl(out_key(rid)) > 0  # result streams expire
        redis.delete(out_key(rid))
    for tier in TIERS:  # finished entries are ACKed and deleted: lanes do not grow
        assert redis.xlen(lane_key(model_name, tier)) == 0
        assert redis.xpending(lane_key(model_name, tier), "workers")["pending"] == 0
    assert worker.inflight == {} and engine.num_free_blocks == engine.num_total_blocks


def test_highest_tier_is_pulled_first(tiny_engine_factory, redis, model_name):
    worker = _worker(tiny_engine_factory(max_num_seqs=1), redis, model_name)
    batch = _submit(redis, model_name, "batch", max_tokens=1)
    priority = _submit(redis, model_name, "priority", max_tokens=1)
    worker.run_once()  # room for one request: the priority one, though it arrived second
    assert _results(redis, priority)[-1].done
    assert _results(redis, batch) == []
    _run_until_done(worker, redis, [batch])
    redis.delete(out_key(batch), out_key(priority))


def test_cancel_aborts_within_one_step_and_frees_blocks(tiny_engine_factory, redis, model_name):
    engine = tiny_engine_factory()
    worker = _worker(engine, redis, model_name)
    idle_free = engine.num_free_blocks
    rid = _submit(redis, model_name, prompt=list(range(3, 60)), max_tokens=150)
    for _ in range(3):
        worker.run_once()
    assert engine.num_free_blocks < idle_free
    redis.set(cancel_key(rid), b"1", ex=60)
    worker.run_once()
    last = _results(redis, rid)[-1]
    assert last.done and last.finish_reason == "abort" and last.num_output_tokens == 0
    assert engine.num_free_blocks == idle_free and not engine.has_unfinished()
    assert redis.xlen(lane_key(model_name, "standard")) == 0
    redis.delete(out_key(rid), cancel_key(rid))


def test_invalid_request_comes_back_as_an_error_result(tiny_engine_factory, redis, model_name):
    worker = _worker(tiny_engine_factory(), redis, model_name)
    rid = _submit(redis, model_name, prompt=[1] * 250, max_tokens=50)  # the tiny model holds 256 positions
    worker.run_once()
    (error,) = _results(redis, rid)
    assert error.kind == "error" and error.done and error.error_code == "context_length_exceeded"
    assert "maximum context length" in error.error_message
    assert redis.xlen(lane_key(model_name, "standard")) == 0
    redis.delete(out_key(rid))


@pytest.mark.parametrize("weight", [None, float("nan"), 0.0])
def test_an_entry_whose_weight_is_no_number_is_an_error_result_not_a_dead_worker(
    tiny_engine_factory, redis, model_name, weight
):
    """A tenant weight stored as NaN went into lane entries as null, and the engine's comparison
    raised out of the worker: it died, and each worker that claimed the entry after it died too."""
    worker = _worker(tiny_engine_factory(), redis, model_name)
    bad = _submit(redis, model_name, max_tokens=4, weight=weight)
    good = _submit(redis, model_name, max_tokens=4)
    _run_until_done(worker, redis, [bad, good])
    (error,) = _results(redis, bad)
    assert error.kind == "error" and error.error_param == "weight"
    assert [r.num_output_tokens for r in _results(redis, good)][-1] == 4
    assert redis.xlen(lane_key(model_name, "standard")) == 0
    redis.delete(out_key(bad), out_key(good))


def test_a_dead_workers_request_is_claimed_and_resumed(tiny_engine_factory, redis, model_name):
    prompt, max_tokens = (9, 8, 7, 6, 5), 20
    dead = _worker(tiny_engine_factory(), redis, model_name, worker_id="dead")
    survivor = _worker(tiny_engine_factory(), redis, model_name, worker_id="survivor", claim_idle_ms=1500)
    rid = _submit(redis, model_name, prompt=prompt, max_tokens=max_tokens)
    for _ in range(6):
        dead.run_once()  # then it stops: no more steps, no heartbeat, its entry stays pending
    survivor.run_once()
    assert rid not in survivor.inflight  # a just-delivered entry is not idle enough to be taken
    published = [t for r in _results(redis, rid) for t in r.token_ids]
    assert 0 < len(published) < max_tokens
    time.sleep(1.6)
    _run_until_done(survivor, redis, [rid])
    results = _results(redis, rid)
    tokens = [t for r in results for t in r.token_ids]
    assert tokens == _greedy(tiny_engine_factory(), prompt, max_tokens)
    assert {r.worker for r in results} == {"dead", "survivor"}
    assert [r.offset for r in results] == list(range(max_tokens))
    assert redis.xpending(lane_key(model_name, "standard"), "workers")["pending"] == 0
    redis.delete(out_key(rid))


def test_a_dead_workers_n_gt_1_request_ends_worker_lost_not_invalid(tiny_engine_factory, redis, model_name):
    """The engine resumes one sequence, not n choices: the survivor's engine refused the claimed
    n = 3 request as the client's error (invalid_request on resume_token_ids, a 400 over HTTP)."""
    engine = tiny_engine_factory()
    dead = _worker(tiny_engine_factory(), redis, model_name, worker_id="dead")
    survivor = _worker(engine, redis, model_name, worker_id="survivor", claim_idle_ms=1500)
    rid = f"req-{uuid.uuid4().hex[:12]}"
    sampling = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, n=3)
    request = LaneRequest(rid, model_name, "standard", "acme", (9, 8, 7, 6, 5), sampling)
    redis.xadd(lane_key(model_name, "standard"), request.encode())
    for _ in range(6):
        dead.run_once()
    assert any(r.token_ids for r in _results(redis, rid))
    time.sleep(1.6)
    _run_until_done(survivor, redis, [rid])
    last = _results(redis, rid)[-1]
    assert last.kind == "error" and last.done and last.worker == "survivor"
    assert last.error_code == "worker_lost" and "n > 1 cannot be resumed" in (last.error_message or "")
    assert redis.xpending(lane_key(model_name, "standard"), "workers")["pending"] == 0
    assert survivor.inflight == {} and engine.num_free_blocks == engine.num_total_blocks
    redis.delete(out_key(rid))


def _frozen_and_claimer(tiny_engine_factory, redis, model_name):
    """Two workers of one model with a 1.5 s claim time: the one to freeze (with its engine) and
    the one that claims its entries."""
    frozen_engine = tiny_engine_factory()
    frozen = _worker(frozen_engine, redis, model_name, worker_id="frozen", claim_idle_ms=1500)
    claimer = _worker(tiny_engine_factory(), redis, model_name, worker_id="claimer", claim_idle_ms=1500)
    return frozen_engine, frozen, claimer


@pytest.mark.parametrize("noticed_by", ["heartbeat", "step"])
def test_a_worker_frozen_past_the_claim_time_leaves_its_request_to_the_claimer(
    tiny_engine_factory, redis, model_name, noticed_by
):
    """A worker stalled (SIGSTOP, a VM pause) longer than claim_idle_ms: another claims and resumes
    its request. On waking, its heartbeat's XCLAIM took the entry back and both ran the request,
    publishing at the same offsets (sampled tokens: the client got a mix of two continuations)."""
    from gateway.worker.heartbeat import beat

    prompt, max_tokens = (9, 8, 7, 6, 5), 20
    frozen_engine, frozen, claimer = _frozen_and_claimer(tiny_engine_factory, redis, model_name)
    rid = _submit(redis, model_name, prompt=prompt, max_tokens=max_tokens)
    for _ in range(6):
        frozen.run_once()
    time.sleep(1.6)  # frozen: no step, no heartbeat
    claimer.run_once()
    assert rid in claimer.inflight
    owned = frozen.owned_entries()
    assert frozen.lane_io.reclaim(owned).taken == owned  # pending for the claimer now
    if noticed_by == "heartbeat":  # it wakes: its heartbeat finds the entry taken
        beat(frozen, redis)
    frozen.run_once()  # drops the request (else its step, long after its last publish, asks first)
    assert frozen.inflight == {} and frozen_engine.num_free_blocks == frozen_engine.num_total_blocks
    _run_until_done(claimer, redis, [rid])
    for _ in range(3):
        frozen.run_once()
    results = _results(redis, rid)
    assert [r.offset for r in results] == list(range(max_tokens))  # each token published once
    assert results[-1].worker == "claimer"
    assert [t for r in results for t in r.token_ids] == _greedy(tiny_engine_factory(), prompt, max_tokens)
    redis.delete(out_key(rid))


def test_a_worker_frozen_until_the_claimer_finished_drops_the_request(tiny_engine_factory, redis, model_name):
    """Its entry ACKed by the claimer: taken for one a restarted Redis lost, the request ran on to
    its end here a second time, its results published after the last one."""
    prompt, max_tokens = (9, 8, 7, 6, 5), 12
    frozen_engine, frozen, claimer = _frozen_and_claimer(tiny_engine_factory, redis, model_name)
    rid = _submit(redis, model_name, prompt=prompt, max_tokens=max_tokens)
    for _ in range(4):
        frozen.run_once()
    time.sleep(1.6)
    _run_until_done(claimer, redis, [rid])
    published = len(_results(redis, rid))
    for _ in range(3):
        frozen.run_once()
    assert frozen.inflight == {} and frozen_engine.num_free_blocks == frozen_engine.num_total_blocks
    assert len(_results(redis, rid)) == published
    redis.delete(out_key(rid))


def test_dead_consumers_with_nothing_pending_are_pruned(tiny_engine_factory, redis, model_name):
    engine = tiny_engine_factory()
    gone = _worker(engine, redis, model_name, worker_id="gone")
    rid = _submit(redis, model_name, max_tokens=1)
    _run_until_done(gone, redis, [rid])  # "gone" is now a consumer of the group with nothing pending
    redis.delete(out_key(rid))
    live = _worker(engine, redis, model_name, worker_id="live")
    names = lambda: {
        _s(c["name"]) for c in redis.xinfo_consumers(lane_key(model_name, "standard"), "workers")
    }
    assert "gone" in names()
    assert live.lane_io.prune_consumers(idle_ms=60_000) == 0  # not idle long enough
    time.sleep(0.05)
    assert live.lane_io.prune_consumers(idle_ms=10) >= 1
    assert "gone" not in names()


def _s(value):
    return value.decode() if isinstance(value, bytes) else value


def test_a_started_worker_beats_at_once(tiny_engine_factory, redis, model_name):
    """The first heartbeat does not wait a period: gateways see a (re)started worker at once."""
    import threading

    from gateway.lanes.keys import workers_key
    from gateway.worker.heartbeat import heartbeat

    worker = _worker(tiny_engine_factory(), redis, model_name, worker_id="fresh")
    stop = threading.Event()
    thread = threading.Thread(
        target=heartbeat, args=(worker, redis, stop), kwargs={"every_s": 60}, daemon=True
    )
    started = time.time()
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while redis.zscore(workers_key(model_name), "fresh") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert redis.zscore(workers_key(model_name), "fresh") >= started  # long before the 60 s period
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_a_lane_deleted_under_a_blocked_worker_is_re_created(tiny_engine_factory, redis, model_name):
    """Redis answers a blocked XREADGROUP whose stream is deleted with UNBLOCKED: the worker
    re-creates its lanes and serves on, it does not die."""
    import threading

    worker = Worker(
        tiny_engine_factory(), redis, model=model_name, tiers=TIERS, worker_id="w1", block_ms=2000
    )
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # blocked on the lanes
        redis.delete(*(lane_key(model_name, tier) for tier in TIERS))
        time.sleep(0.5)
        assert thread.is_alive()
        rid = _submit(redis, model_name, max_tokens=3)
        deadline = time.monotonic() + 30
        while not (_results(redis, rid) and _results(redis, rid)[-1].done) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(len(r.token_ids) for r in _results(redis, rid)) == 3
    finally:
        stop.set()
        thread.join(timeout=10)


def _commands_naming(redis, model, action) -> list[str]:
    """The commands naming ``model`` that clients (scripts' own calls left out) sent while ``action``
    ran, as Redis's MONITOR saw them."""
    marker = f"end-of-{model}"
    with redis.monitor() as monitor:
        action()
        redis.echo(marker)
        seen = []
        while marker not in (command := monitor.next_command())["command"]:
            if command["client_type"] != "lua" and model in command["command"]:
                seen.append(command["command"])
    return seen


def test_an_idle_worker_only_blocks_on_its_lanes_and_wakes_for_a_request(
    tiny_engine_factory, redis, model_name
):
    """Idle, a worker sends one blocking XREADGROUP an iteration (its lanes' XLENs in the same
    packet) and nothing else (no take) until its next look for a dead worker's entries; a request
    added while it blocks is admitted by that same iteration, and once it is done the worker blocks
    again without a take."""
    worker = _worker(tiny_engine_factory(), redis, model_name, claim_idle_ms=600_000)
    worker.run_once()  # the first take, with its look for a dead worker's entries, finds nothing
    commands = _commands_naming(redis, model_name, lambda: [worker.run_once() for _ in range(5)])
    reads = [c for c in commands if not c.startswith("XLEN")]  # each read's lanes' lengths ride with it
    assert len(reads) == 5 and len(commands) == 5 * 4, commands
    assert all(c.startswith("XREADGROUP") and "BLOCK" in c for c in reads), commands

    worker.lane_io.block_ms = 60_000  # only the request ends this read
    rid = f"req-{uuid.uuid4().hex[:12]}"
    arrival = threading.Timer(0.2, _submit, args=(redis, model_name), kwargs=dict(request_id=rid))
    arrival.start()
    worker.run_once()
    arrival.join()
    assert rid in worker.inflight and _results(redis, rid)  # admitted and stepped in that iteration
    _run_until_done(worker, redis, [rid])
    # its last take left nothing in a backlog: once the engine is empty the worker blocks at once
    worker.lane_io.block_ms = 10
    command, *lengths = _commands_naming(redis, model_name, worker.run_once)
    assert command.startswith("XREADGROUP") and "BLOCK" in command
    assert len(lengths) == 3 and all(c.startswith("XLEN") for c in lengths)
    redis.delete(out_key(rid))


def test_entries_a_take_left_in_the_backlog_are_taken_before_the_worker_blocks(
    tiny_engine_factory, redis, model_name
):
    """A take with room for one moves a burst of three into the lane's backlog; once the engine is
    empty the worker takes again rather than block on a read that would not see them."""
    from gateway.lanes.keys import lane_backlog_key

    worker = _worker(tiny_engine_factory(max_num_seqs=1), redis, model_name, claim_idle_ms=600_000)
    rids = [_submit(redis, model_name, max_tokens=2) for _ in range(3)]
    worker.lane_io.block_ms = 2000  # a read the backlog cannot end
    worker.run_once()
    assert len(worker.inflight) == 1 and worker.lane_io.backlogged
    assert redis.zcard(lane_backlog_key(model_name, "standard")) == 1  # the other two, one tenant's
    _run_until_done(worker, redis, rids, max_iters=12)
    assert worker.inflight == {} and not worker.lane_io.backlogged
    for rid in rids:
        redis.delete(out_key(rid))
