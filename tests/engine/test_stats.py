"""EngineStats' mean KV utilization: every step while the running sequences hold few blocks, and
one step in ceil(blocks / UTILIZATION_BLOCKS) when they hold many, so its walk over the blocks
stays off the step's critical path (128 sequences x 4,096 tokens would cost ~13 ms a step)."""

from __future__ import annotations

from test_events import TINY

from engine import LLM, SamplingParams
from engine.stats import UTILIZATION_BLOCKS


def _llm(blocks: int) -> LLM:
    return LLM(
        model="dummy",
        dummy_config=TINY,
        dtype="float32",
        block_size=4,
        num_kv_blocks=blocks,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        max_model_len=256,
    )


def test_few_blocks_sample_every_step_and_match_the_block_managers_figure():
    llm = _llm(64)
    eng = llm.engine
    eng.add_request("a", [5] * 10, SamplingParams(max_tokens=4, ignore_eos=True))
    eng.step()  # prefill: 10 tokens computed in 3 blocks of 4
    assert eng.stats.utilization_steps == 1 and eng.stats.kv_utilization == 10 / 12
    while eng.has_unfinished():
        eng.step()
    assert eng.stats.utilization_steps == eng.stats.steps


def test_many_blocks_sample_fewer_steps():
    llm = _llm(4096)
    eng = llm.engine
    for i in range(40):  # 40 x 200 tokens in blocks of 4: 2,000+ blocks held
        eng.add_request(f"r{i}", [2 + i] * 200, SamplingParams(max_tokens=30, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert eng.stats.preemptions == 0 and eng.stats.steps > 30
    # once all 40 decode they hold over 2,000 blocks: one step in 9 or more is sampled
    assert 40 * 200 // 4 > 7 * UTILIZATION_BLOCKS
    assert 1 <= eng.stats.utilization_steps < eng.stats.steps // 2
    assert 0.9 < eng.stats.kv_utilization <= 1.0
