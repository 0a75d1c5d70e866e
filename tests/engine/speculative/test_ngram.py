"""Prompt lookup (engine/speculative/ngram.py): the n-gram index grown step by step finds what a
scan of the whole context finds, and on the real SmolLM2 (fp32) drafts longer than k under
preemption (by recompute and by swap) leave the greedy output token for token that of decoding
without drafts, and every KV block free."""

import random

import pytest

from engine import SamplingParams
from engine.request import Sequence
from engine.speculative import SpeculativeConfig
from engine.speculative.ngram import NgramIndex, NgramProposer
from tests.engine.paths import FP32_C


def _scan(tokens: list[int], config: SpeculativeConfig, k: int) -> list[int]:
    """The tokens after the latest earlier occurrence of the longest suffix n-gram: a full scan."""
    total = len(tokens)
    for n in range(min(config.prompt_lookup_max, total - 1), config.prompt_lookup_min - 1, -1):
        for start in range(total - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[total - n :]:
                return tokens[start + n : start + n + k]
    return []


def test_index_grown_step_by_step_finds_what_a_scan_finds():
    rng = random.Random(0)
    hits = 0
    for _ in range(200):
        config = SpeculativeConfig(prompt_lookup_min=rng.randint(1, 3), prompt_lookup_max=rng.randint(3, 5))
        tokens = [rng.randint(0, 3) for _ in range(rng.randint(0, 6))]
        index = NgramIndex(tokens, config)
        for _ in range(40):
            k = rng.randint(0, 9)
            if rng.random() < 0.7:  # some steps draft nothing: the index catches up later
                draft = index.lookup(k)
                assert draft == _scan(tokens, config, k), (tokens, k)
                hits += bool(draft)
            tokens += [rng.randint(0, 3) for _ in range(rng.randint(1, 4))]  # kept tokens
    assert hits > 1000  # the small alphabet repeats: most lookups match


def test_a_sequence_keeps_its_index_and_a_new_token_list_rebuilds_it():
    config = SpeculativeConfig(min_priority=0)
    proposer = NgramProposer(config, max_model_len=1024)
    seq = Sequence("r", [1, 2, 3, 9, 1, 2], 6, SamplingParams(max_tokens=64))
    assert proposer.drafts(seq, budget=8, num_running=1) == [3, 9, 1, 2]
    index = seq.draft_index
    seq.token_ids += [3, 9]
    assert proposer.drafts(seq, budget=8, num_running=1) == [1, 2, 3, 9]  # "3 9" last seen at 2..3
    assert seq.draft_index is index
    seq.token_ids = [5, 6, 7, 5, 6]  # another list (not the one indexed): indexed afresh
    assert proposer.drafts(seq, budget=8, num_running=1) == [7, 5, 6]
    assert seq.draft_index is not index


CODE = (
    "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * item.count\n"
    "    return result\n\ndef average(items):\n    if not items:\n        return 0\n"
    "    return total(items) / len(items)\n"
)
ASKS = [
    f"Repeat this code exactly:\n{CODE}",
    f"Repeat this code exactly, then once more:\n{CODE}",
    f"Copy this code:\n{CODE}",
]


@pytest.mark.real_model
@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_long_drafts_under_preemption_equal_no_speculation(preemption_mode):
    k = 2
    spec = {"num_speculative_tokens": k, "max_num_speculative_tokens": 16, "min_priority": 0}
    # 28 blocks of 8 tokens: three ~90-token prompts with 40 outputs each do not fit together
    kw = dict(num_kv_blocks=28, block_size=8, preemption_mode=preemption_mode, num_swap_blocks=64)
    plain = FP32_C.llm(**kw)
    prompts = [plain.encode([{"role": "user", "content": ask}]) for ask in ASKS]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    want = plain.generate(prompts, params)
    llm = FP32_C.llm(speculative_config={"method": "ngram", **spec}, **kw)
    got = llm.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    eng, stats = llm.engine, llm.engine.stats
    assert stats.preemptions > 0 and (stats.swaps > 0) == (preemption_mode == "swap")
    assert max(stats.spec_draft_lengths) > k, stats.spec_draft_lengths  # drafts grew past k
    assert stats.spec_acceptance_rate > 0.5, stats.spec_acceptance_rate
    assert eng.num_free_blocks == eng.num_total_blocks and not eng.seqs
