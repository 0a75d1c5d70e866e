"""Continuous, static and dynamic batching (EngineConfig.batching) run the same kernels: on the
real model in fp32 every request gets the same greedy tokens whichever mode batched it."""

import pytest

from engine import LLM, SamplingParams

CHATS = [
    [{"role": "user", "content": text}]
    for text in (
        "Name three colors.",
        "What is 7 times 8?",
        "Write a haiku about rain.",
        "Say hello in French.",
        "List two planets.",
        "Why is the sky blue?",
        "Count from one to five.",
    )
]
MAX_TOKENS = [2, 9, 5, 12, 3, 6, 10]  # mixed lengths: batches end at different steps


@pytest.fixture(scope="module")
def outputs(smollm2):
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    runs = {"continuous": [c.token_ids for c in smollm2.generate(CHATS, params)]}
    for mode in ("static", "dynamic"):
        llm = LLM(
            model="smollm2",
            dtype="float32",
            num_threads=2,
            batching=mode,
            max_num_seqs=3,
            max_num_batched_tokens=64,
            batch_wait_s=0.01,
        )
        runs[mode] = [c.token_ids for c in llm.generate(CHATS, params)]
        runs[f"{mode}_steps"] = llm.engine.stats.steps
    return runs


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_every_mode_gives_each_request_the_same_greedy_tokens(outputs, mode):
    assert [len(t) for t in outputs[mode]] == MAX_TOKENS
    assert outputs[mode] == outputs["continuous"]


def test_static_batches_run_until_their_longest_member_ends(outputs):
    # 7 requests in batches of 3 (FCFS): each batch runs as long as its longest member, so at
    # least 9 + 12 + 10 steps; continuous batching would start a request whenever one ends.
    assert outputs["static_steps"] >= 9 + 12 + 10
