"""Every policy leaves the engine token-exact: greedy output equals Hugging Face's, with
preemption (16 blocks), several tenants and tiers."""

import pytest
from hf_reference import hf_greedy

from engine import Engine, SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 47)), [3] * 17, [50, 51], list(range(60, 90))]
MAX_TOKENS = [20, 9, 33, 12, 25]


@pytest.fixture(scope="module")
def reference(tiny_hf):
    return hf_greedy(tiny_hf, PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("policy", ["fcfs", "priority", "vtc", "priority+vtc", "priority+vtc+slo"])
def test_greedy_matches_hf_with_every_policy(tiny_model_dir, reference, policy):
    eng = Engine(
        model=str(tiny_model_dir),
        dtype="float32",
        block_size=4,
        num_kv_blocks=16,
        max_num_batched_tokens=16,
        max_num_seqs=3,
        policy=policy,
    )
    for i, (ids, n) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        eng.add_request(
            str(i),
            ids,
            SamplingParams(max_tokens=n, temperature=0, ignore_eos=True),
            tenant="AB"[i % 2],
            weight=1.0 + i % 2,
            priority=i % 3,
        )
    out = {str(i): [] for i in range(len(PROMPTS))}
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
    assert [out[str(i)] for i in range(len(PROMPTS))] == reference
    assert eng.num_free_blocks == eng.num_total_blocks
