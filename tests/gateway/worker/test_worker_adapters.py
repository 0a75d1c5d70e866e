"""The worker runs each lane request with the adapter its message names, loaded from the adapter
store on first use: tokens equal the offline engine's with the same PEFT folder, adapters and the
base model mix in one batch, slot loads and evictions reach Prometheus, and an adapter gone from
the store is a model_not_found error result."""

from __future__ import annotations

import uuid

import pytest
from adapter_files import ALL, make_peft_adapter
from gateway_test_helpers import TINY
from prometheus_client import REGISTRY
from worker_lanes import results as _results

from engine import LoRARequest, SamplingParams
from gateway.adapters.store import AdapterStore
from gateway.lanes.keys import lane_key
from gateway.lanes.messages import LaneAdapter, LaneRequest, LaneResult
from gateway.worker.loop import Worker

TIERS = ["priority", "standard", "batch"]
PROMPT = (5, 6, 7, 8, 9, 10)
N = 8


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("peft-tiny")
    return [
        make_peft_adapter(root / f"a{i}", TINY, r=r, targets=targets, seed=10 + i, b_std=2.0)
        for i, (r, targets) in enumerate([(4, ("q_proj", "v_proj")), (8, ALL), (2, ("down_proj",))])
    ]


@pytest.fixture
def stored(adapter_dirs, tmp_path):
    """The adapters in a store: (store, [LaneAdapter])."""
    store = AdapterStore(tmp_path / "adapters")
    refs = []
    for i, folder in enumerate(adapter_dirs):
        with open(folder / "adapter_model.safetensors", "rb") as weights:
            digest = store.put((folder / "adapter_config.json").read_bytes(), weights)
        refs.append(LaneAdapter(id=i + 1, name=folder.name, sha256=digest))
    return store, refs


def _submit(redis, model, lora=None, max_tokens=N):
    rid = f"req-{uuid.uuid4().hex[:12]}"
    req = LaneRequest(
        request_id=rid,
        model=model,
        tier="standard",
        tenant="acme",
        prompt_token_ids=PROMPT,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        lora=lora,
    )
    redis.xadd(lane_key(model, "standard"), req.encode())
    return rid


def _run(worker, redis, rids, max_iters=500) -> dict[str, list[LaneResult]]:
    for _ in range(max_iters):
        worker.run_once()
        results = {rid: _results(redis, rid) for rid in rids}
        if all(r and r[-1].done for r in results.values()):
            return results
    raise AssertionError("requests did not finish")


def _offline(engine, lora) -> list[int]:
    engine.add_request(
        "ref", list(PROMPT), SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True), lora=lora
    )
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


def _counter(name, worker_id) -> float:
    return REGISTRY.get_sample_value(f"fairlane_engine_{name}_total", {"worker": worker_id}) or 0.0


def test_each_request_runs_with_its_own_adapter_from_the_store(
    tiny_engine_factory, redis, model_name, stored, adapter_dirs
):
    store, refs = stored
    worker_id = f"w-{uuid.uuid4().hex[:6]}"
    worker = Worker(
        tiny_engine_factory(),
        redis,
        model=model_name,
        tiers=TIERS,
        worker_id=worker_id,
        block_ms=10,
        adapter_dir=store.root,
    )
    worker.setup()
    loras = [refs[0], None, refs[1], refs[2], refs[0]]
    rids = [_submit(redis, model_name, lora) for lora in loras]
    results = _run(worker, redis, rids)
    got = [[t for r in results[rid] for t in r.token_ids] for rid in rids]
    reference = tiny_engine_factory()
    want = {None: _offline(reference, None)}
    for ref, folder in zip(refs, adapter_dirs):
        want[ref] = _offline(reference, str(folder))
    assert got == [want[lora] for lora in loras]
    assert len({tuple(w) for w in want.values()}) == 4  # every adapter changes the output
    assert worker.engine.stats.lora_slot_loads == 3
    assert _counter("lora_slot_loads", worker_id) == 3


def test_more_adapters_than_slots_are_evicted_and_counted(
    tiny_engine_factory, redis, model_name, stored, adapter_dirs
):
    store, refs = stored
    worker_id = f"w-{uuid.uuid4().hex[:6]}"
    worker = Worker(
        tiny_engine_factory(max_loras=1),
        redis,
        model=model_name,
        tiers=TIERS,
        worker_id=worker_id,
        block_ms=10,
        adapter_dir=store.root,
    )
    worker.setup()
    rids = [_submit(redis, model_name, ref) for ref in refs]
    results = _run(worker, redis, rids)
    reference = tiny_engine_factory()
    assert [[t for r in results[rid] for t in r.token_ids] for rid in rids] == [
        _offline(reference, LoRARequest(ref.name, str(folder))) for ref, folder in zip(refs, adapter_dirs)
    ]
    assert worker.engine.stats.lora_slot_evictions == 2
    assert _counter("lora_slot_loads", worker_id) == 3 and _counter("lora_slot_evictions", worker_id) == 2


def test_an_adapter_gone_from_the_store_is_model_not_found(tiny_engine_factory, redis, model_name, stored):
    store, refs = stored
    worker = Worker(
        tiny_engine_factory(),
        redis,
        model=model_name,
        tiers=TIERS,
        worker_id="w-gone",
        block_ms=10,
        adapter_dir=store.root,
    )
    worker.setup()
    store.remove(refs[0].sha256)
    gone, fine = _submit(redis, model_name, refs[0]), _submit(redis, model_name, refs[1])
    results = _run(worker, redis, [gone, fine])
    error = results[gone][-1]
    assert (error.kind, error.error_code, error.error_param) == ("error", "model_not_found", "model")
    assert f"{model_name}:{refs[0].name}" in error.error_message
    assert results[fine][-1].finish_reason == "length" and worker.engine.num_running == 0
    assert redis.xlen(lane_key(model_name, "standard")) == 0  # both entries acknowledged and removed
