"""The engine's per-request events (what the worker turns into spans) and its counters (what it
turns into metrics), on a tiny random-weight Llama with a KV cache small enough to preempt."""

from __future__ import annotations

import pytest

from engine import Engine, SamplingParams

TINY = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=256,
)
PROMPTS = [list(range(10, 40)), list(range(50, 80)), list(range(90, 120))]


def make_engine(mode: str, **kw) -> Engine:
    # 12 blocks of 4 = 48 slots for three sequences of 30 + 16 tokens: preemptions are certain.
    return Engine(
        model="dummy",
        dummy_config=TINY,
        dtype="float32",
        num_threads=1,
        block_size=4,
        num_kv_blocks=12,
        max_num_batched_tokens=8,
        preemption_mode=mode,
        **kw,
    )


def run(eng: Engine) -> dict[str, list]:
    events: dict[str, list] = {}
    for i, prompt in enumerate(PROMPTS):
        eng.add_request(str(i), prompt, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    while eng.has_unfinished():
        for out in eng.step():
            events.setdefault(out.request_id, []).extend(out.events)
    return events


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_events_tell_each_request_story(mode):
    eng = make_engine(mode)
    events = run(eng)
    assert set(events) == {"0", "1", "2"}
    preempted = []
    for rid, evs in events.items():
        names = [e.name for e in evs]
        times = [e.time for e in evs]
        assert times == sorted(times), rid
        assert names[0] == "admitted" and names[-1] == "finished", names
        assert evs[-1].attrs == {"finish_reason": "length"}
        assert names.count("first_token") == 1
        # The prompt of 30 tokens runs in chunks of at most 8 (the token budget): one event per chunk.
        chunks = [e.attrs for e in evs if e.name == "prefill_chunk"]
        assert chunks and all(1 <= c["tokens"] <= 8 for c in chunks)
        if "preempted" not in names:  # the prompt exactly, in order
            assert sum(c["tokens"] for c in chunks) == 30 and chunks[0]["start"] == 0
        for i, name in enumerate(names):
            if name == "preempted":
                assert evs[i].attrs["mode"] == mode
                assert "resumed" in names[i:], names
                resumed = evs[i + names[i:].index("resumed")]
                assert resumed.attrs["mode"] == mode
                preempted.append(rid)
    assert preempted, "the small cache should have preempted someone"
    stats = eng.stats
    assert stats.preemptions == len(preempted)
    assert (stats.swaps > 0) == (mode == "swap") and (stats.recompute_preemptions > 0) == (
        mode == "recompute"
    )
    # Three first admissions plus one readmission per preemption.
    assert stats.admissions == 3 + stats.preemptions
    assert 1 <= stats.last_step_seqs <= 3 and stats.last_step_tokens >= stats.last_step_seqs
    assert stats.last_step_seconds > 0
    assert eng.num_running == eng.num_waiting == eng.num_swapped == 0
    assert eng.block_manager.num_used_blocks == 0


def test_prefix_hits_are_counted_and_reported_on_admission():
    eng = make_engine("recompute", enable_prefix_caching=True)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    eng.add_request("a", PROMPTS[0], params)
    while eng.has_unfinished():
        eng.step()
    eng.add_request("b", PROMPTS[0], params)  # the same prompt: its full blocks are cached
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    admitted = [e for o in outs for e in o.events if e.name == "admitted"]
    assert admitted[0].attrs["cached_tokens"] == 28  # 7 full blocks of 4 (one token is always computed)
    assert eng.stats.prefix_hit_tokens == 28


def test_take_events_keeps_what_happened_to_an_aborted_request():
    eng = make_engine("recompute")
    eng.add_request("x", PROMPTS[0], SamplingParams(max_tokens=16))
    eng.step()
    events = eng.take_events("x")
    assert [e.name for e in events] == ["admitted", "prefill_chunk"]
    assert eng.abort("x") and eng.take_events("x") == []
