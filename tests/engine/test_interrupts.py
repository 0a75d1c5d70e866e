"""Urgent prompts that start between two layers of a step in flight (engine/interrupts.py): their
first token comes out before the step ends, and every output, theirs and the step's, is what the
engine gives without the interruption (greedy; on every numeric path: fp32 and bf16 with the C
kernels and with torch, bf16 with oneDNN's linears, INT8), with every block back at the end."""

from __future__ import annotations

import pytest
from paths import BF16_AMX, BF16_C, BF16_TORCH, FP32_C, FP32_TORCH, INT8, params

from engine import Engine, SamplingParams, interrupts
from engine.interrupts import Interrupt
from engine.models.bf16_linear import bf16_library

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
BULK = [[3 + (i * 7 + j) % 200 for j in range(40)] for i in range(4)]  # 160 prompt tokens: chunked
URGENT = [50 + j for j in range(20)]


def engine(model_dir, policy: str, **overrides) -> Engine:
    settings = dict(
        model=str(model_dir), dtype="float32", num_threads=1, policy=policy, max_num_seqs=8,
        max_num_batched_tokens=64, num_kv_blocks=64, block_size=8,
    )  # fmt: skip
    return Engine(**{**settings, **overrides})


def add_bulk(eng: Engine, policy: str = "priority") -> None:
    for i, prompt in enumerate(BULK):
        eng.add_request(f"b{i}", prompt, GREEDY, priority=0, tenant="heavy")


def add_urgent(eng: Engine, request_id: str = "u") -> None:
    eng.add_request(request_id, URGENT, GREEDY, priority=1, tenant="light")


def finish_one(eng: Engine, tokens: dict[str, list[int]]) -> None:
    for out in eng.step():
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)


def finish(eng: Engine, tokens: dict[str, list[int]]) -> None:
    while eng.has_unfinished():
        finish_one(eng, tokens)


def prefilled(eng: Engine) -> bool:
    return all(s.num_computed_tokens >= s.num_prompt_tokens for s in eng.seqs.values())


@pytest.mark.parametrize("path", params([FP32_C, FP32_TORCH, BF16_C, BF16_AMX, BF16_TORCH, INT8]))
@pytest.mark.parametrize("policy", ["priority", "vtc"])
@pytest.mark.parametrize("during", ["prefill", "decode"])
def test_an_urgent_prompt_starts_inside_the_step_in_flight(tiny_model_dir, policy, during, path):
    """`prefill`: a step of prompt chunks (the per-operator forward); `decode`: a decode-only step
    (the one-call C decode forward, which calls the hook from its layer loop)."""
    reference: dict[str, list[int]] = {}
    ref = engine(tiny_model_dir, policy, **path.overrides())
    add_bulk(ref, policy)
    finish_one(ref, reference)
    while during == "decode" and not prefilled(ref):
        finish_one(ref, reference)
    add_urgent(ref)  # between steps: it starts in the next one
    finish(ref, reference)

    eng = engine(tiny_model_dir, policy, **path.overrides())
    add_bulk(eng, policy)
    tokens: dict[str, list[int]] = {}
    finish_one(eng, tokens)
    while during == "decode" and not prefilled(eng):
        finish_one(eng, tokens)
    if during == "decode" and path.cpu_kernels and (path.dtype != "bfloat16" or bf16_library()):
        assert eng.runner.model.decode is not None  # the next step runs in one C call (bf16: where
        # the CPU has the AVX512-BF16 kernel; elsewhere the per-operator forward stops between layers)
    polls, delivered = [], []

    def poll() -> None:
        polls.append(len(delivered))
        if len(polls) == 1:
            add_urgent(eng)

    step_outputs = eng.step(Interrupt(poll=poll, deliver=delivered.extend))
    assert eng.runner.model.between_layers is None  # unhooked after the step
    assert [out.request_id for out in delivered] == ["u"]  # its first token, before the step ended
    assert len(delivered[0].new_token_ids) == 1 and not delivered[0].finished
    assert "u" not in {out.request_id for out in step_outputs}  # handed out once
    assert len(polls) == len(eng.runner.model.layers)  # the step in flight kept stopping after it
    assert eng.stats.interrupts == 1
    admitted = [e for e in delivered[0].events if e.name == "admitted"]
    assert admitted and admitted[0].attrs.get("interrupting") is True

    for out in [*delivered, *step_outputs]:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    finish(eng, tokens)
    assert tokens == reference  # the same greedy tokens for every request
    assert eng.num_free_blocks == eng.num_total_blocks


@pytest.mark.parametrize("cap", [interrupts.MAX_NESTED, 2])
def test_urgent_prompts_arriving_at_later_layers_start_in_the_same_step(tiny_model_dir, monkeypatch, cap):
    """Each stop after a nested step can start another, up to MAX_NESTED in one step in flight;
    then the step in flight runs to its end without stopping."""
    monkeypatch.setattr(interrupts, "MAX_NESTED", cap)
    eng = engine(tiny_model_dir, "priority")
    add_bulk(eng, "priority")
    eng.step()
    layers = len(eng.runner.model.layers)
    assert layers >= 3
    polls, delivered = [], []

    def poll() -> None:  # an urgent prompt arrives at every stop
        polls.append(1)
        add_urgent(eng, f"u{len(polls)}")

    outputs = eng.step(Interrupt(poll=poll, deliver=delivered.extend))
    nested = min(cap, layers)
    assert [out.request_id for out in delivered] == [f"u{i}" for i in range(1, nested + 1)]
    assert eng.stats.interrupts == nested and len(polls) == nested  # no stop after the cap
    assert not {out.request_id for out in outputs} & {out.request_id for out in delivered}
    tokens: dict[str, list[int]] = {}
    for out in [*delivered, *outputs]:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    finish(eng, tokens)
    assert all(len(tokens[f"u{i}"]) == GREEDY.max_tokens for i in range(1, nested + 1))
    assert eng.num_free_blocks == eng.num_total_blocks


def test_an_exception_in_the_hook_comes_out_of_the_one_call_decode(tiny_model_dir):
    eng = engine(tiny_model_dir, "priority")
    add_bulk(eng, "priority")
    while not prefilled(eng):
        eng.step()

    def poll() -> None:
        raise RuntimeError("from the driver")

    with pytest.raises(RuntimeError, match="from the driver"):
        eng.step(Interrupt(poll=poll, deliver=lambda outs: None))


def starts_next_step(eng: Engine, before_add=lambda: None) -> None:
    """An urgent prompt added at the step's first stop does not start inside it: it runs whole in
    the steps after, and every block comes back."""
    add_bulk(eng, "priority")
    eng.step()
    delivered: list = []
    polls = []

    def poll() -> None:
        polls.append(1)
        if len(polls) == 1:
            before_add()
            add_urgent(eng)

    outputs = eng.step(Interrupt(poll=poll, deliver=delivered.extend))
    assert polls and not delivered and eng.stats.interrupts == 0
    assert "u" not in {out.request_id for out in outputs}
    tokens: dict[str, list[int]] = {}
    finish(eng, tokens)
    assert len(tokens["u"]) == GREEDY.max_tokens
    assert eng.num_free_blocks == eng.num_total_blocks


def test_no_urgent_prompt_no_nested_step(tiny_model_dir):
    """FCFS has no urgent work: a request that arrives mid-step waits for the next step."""
    starts_next_step(engine(tiny_model_dir, "fcfs"))


def test_a_prompt_that_needs_the_reserve_waits_for_the_next_step(tiny_model_dir):
    """Blocks for a nested step come from above the reserve only: without them, no interruption."""
    eng = engine(tiny_model_dir, "priority", num_kv_blocks=26, watermark=0.4)  # a reserve of 10 blocks

    def short_of_blocks() -> None:
        needs = eng.block_manager.blocks_needed(len(URGENT))
        assert eng.num_free_blocks - needs < eng.scheduler._reserve <= eng.num_free_blocks

    starts_next_step(eng, short_of_blocks)


def test_static_batching_is_never_interrupted(tiny_model_dir):
    eng = engine(tiny_model_dir, "priority", batching="static")
    add_bulk(eng, "priority")
    eng.step()
    polls: list = []
    eng.step(Interrupt(poll=lambda: polls.append(1), deliver=lambda outs: None))
    assert not polls


def test_the_bf16_one_call_decode_stops_between_layers(tiny_model_dir):
    """decode_forward_bf16.c calls the hook as decode_forward.c does (where this CPU runs it)."""
    eng = engine(tiny_model_dir, "priority", dtype="bfloat16")
    if eng.runner.model.decode is None:
        pytest.skip("no one-call bf16 decode on this CPU (it needs AVX512-BF16)")
    add_bulk(eng, "priority")
    while not prefilled(eng):
        eng.step()
    delivered: list = []
    urgent_once = lambda: add_urgent(eng) if "u" not in eng.seqs else None  # noqa: E731
    eng.step(Interrupt(poll=urgent_once, deliver=delivered.extend))
    assert [out.request_id for out in delivered] == ["u"] and eng.stats.interrupts == 1
    finish(eng, {})
    assert eng.num_free_blocks == eng.num_total_blocks


@pytest.mark.parametrize("policy", ["priority", "vtc"])
def test_at_the_sequence_cap_an_urgent_prompt_starts_over_it_and_its_victim_goes_next_step(
    tiny_model_dir, policy
):
    """Every slot is held by the heavy tenant's lower-tier work: the urgent prompt still starts
    inside the step in flight, one over the cap, and the sequence the policy pushes out for it is
    preempted when the next step starts (as the step boundary would have done before admitting
    it); the greedy tokens are those of a run where it arrived between steps."""
    cap = len(BULK)
    reference: dict[str, list[int]] = {}
    ref = engine(tiny_model_dir, policy, max_num_seqs=cap)
    add_bulk(ref, policy)
    while not prefilled(ref):
        finish_one(ref, reference)
    add_urgent(ref)
    finish(ref, reference)

    eng = engine(tiny_model_dir, policy, max_num_seqs=cap)
    add_bulk(eng, policy)
    tokens: dict[str, list[int]] = {}
    while not prefilled(eng):
        finish_one(eng, tokens)
    assert len(eng.scheduler.running) == cap
    delivered: list = []
    urgent_once = lambda: add_urgent(eng) if "u" not in eng.seqs else None  # noqa: E731
    outputs = eng.step(Interrupt(poll=urgent_once, deliver=delivered.extend))
    assert [out.request_id for out in delivered] == ["u"] and eng.stats.interrupts == 1
    assert len(eng.scheduler.running) == cap + 1  # the step in flight kept every one of its own
    for out in [*delivered, *outputs]:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    finish_one(eng, tokens)
    assert len(eng.scheduler.running) == cap  # back under the cap before the next forward
    preempted = [rid for rid, seq in eng.seqs.items() if seq.num_preemptions]
    assert len(preempted) == 1 and preempted[0].startswith("b")
    finish(eng, tokens)
    assert tokens == reference
    assert eng.num_free_blocks == eng.num_total_blocks
