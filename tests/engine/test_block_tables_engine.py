"""The engine's device block tables (engine/block_tables.py) over whole runs: preemption by swap and
by recompute, n > 1 forks, prefix hits; a random-weight Llama on the CPU."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams

SHAPE = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
}


def rows_match(runner, seqs) -> None:
    tables = runner.tables
    for s in seqs:
        if s.block_table:
            n = len(s.block_table)
            assert tables.tensor[tables.row(s), :n].tolist() == [max(b, 0) for b in s.block_table]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_tables_follow_preemption_forks_and_prefix_hits(mode):
    llm = LLM(
        model="dummy",
        dummy_config=SHAPE,
        device="cpu",
        dtype="float32",
        block_size=4,
        num_kv_blocks=40,  # a few sequences' worth: decodes preempt one another
        num_swap_blocks=200,
        preemption_mode=mode,
        max_num_seqs=8,
        max_model_len=160,
    )
    eng, rng = llm.engine, random.Random(0)
    shared = [rng.randrange(2, 128) for _ in range(17)]
    for i in range(6):
        prompt = shared + [rng.randrange(2, 128) for _ in range(rng.randint(1, 20))]
        params = SamplingParams(max_tokens=rng.randint(10, 40), temperature=0, ignore_eos=True, n=1 + i % 2)
        eng.add_request(str(i), prompt, params)
    preempted, schedule = [], eng.scheduler.schedule

    def recording():
        plan = schedule()
        preempted.extend(plan.preempted)
        return plan

    eng.scheduler.schedule = recording
    while eng.has_unfinished():
        eng.step()
        rows_match(eng.runner, eng.scheduler.running)
    assert preempted
    eng.runner.tables.sync()  # the next step's metadata would
    assert not eng.runner.tables.rows  # every finished sequence gave its row back


def test_a_steady_decode_step_copies_only_its_new_blocks():
    """A decode step of 16 sequences whose tables hold 64 blocks or more writes the entries of the
    blocks it allocated (block size 1: one a sequence), not every entry of their tables."""
    llm = LLM(model="dummy", dummy_config=SHAPE, device="cpu", dtype="float32", block_size=1, max_num_seqs=16)
    eng, rng = llm.engine, random.Random(1)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    for i in range(16):
        eng.add_request(str(i), [rng.randrange(2, 128) for _ in range(64)], params)
    while not all(s.num_output_tokens > 0 for s in eng.seqs.values()):
        eng.step()
    tables = eng.runner.tables
    for _ in range(5):
        held = sum(len(s.block_table) for s in eng.scheduler.running)
        written = tables.entries_written
        eng.step()
        new = sum(len(s.block_table) for s in eng.scheduler.running) - held
        assert held >= 16 * 64 and new == 16
        assert tables.entries_written - written == new
        rows_match(eng.runner, eng.scheduler.running)
