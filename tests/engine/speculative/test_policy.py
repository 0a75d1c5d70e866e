"""The speculation policy (engine/speculative/policy.py), plain Python: who drafts, how many, the
acceptance-aware rule (a sequence whose drafts are rejected stops drafting, probes again every
probe_interval steps, and drafts on once a probe's drafts are kept) and the draft length (doubled
after a draft kept whole, up to max_num_speculative_tokens; k after a rejection)."""

from engine.request import SamplingParams, Sequence
from engine.speculative import SpeculativeConfig
from engine.speculative.policy import draft_room, observe

K = 4
CONFIG = SpeculativeConfig(  # a fixed draft length
    num_speculative_tokens=K,
    max_num_speculative_tokens=K,
    min_priority=0,
    min_acceptance=0.2,
    probe_interval=8,
)


def _seq(priority: int = 0, **params) -> Sequence:
    return Sequence("r", [1, 2, 3, 4, 5], 5, SamplingParams(max_tokens=64, **params), priority=priority)


def _room(seq: Sequence, config: SpeculativeConfig = CONFIG, running: int = 1) -> int:
    return draft_room(seq, config, budget=100, num_running=running, max_model_len=1024)


def test_tier_batch_and_request_rules():
    assert _room(_seq()) == K
    assert _room(_seq(), running=CONFIG.max_decoding_seqs + 1) == 0
    assert _room(_seq(priority=-1)) == 0
    assert _room(_seq(presence_penalty=0.5)) == 0
    seq = _seq()
    seq.token_ids += [7] * 62  # 62 of 64 output tokens: the bonus token is the 64th
    assert _room(seq) == 1


def test_rejected_drafts_stop_then_probe_then_resume():
    seq = _seq()
    verifications = 0
    while _room(seq):  # every draft rejected: 1.0, 0.7, 0.49, 0.34, 0.24, 0.17 < 0.2
        observe(seq, K, 0)
        verifications += 1
    assert verifications == 5 and seq.draft_acceptance < CONFIG.min_acceptance
    assert [_room(seq) for _ in range(CONFIG.probe_interval - 1)] == [0] * (CONFIG.probe_interval - 1)
    assert _room(seq) == K  # the probe
    assert _room(seq) == K  # nothing verified yet (an n-gram probe finds no match): it probes on
    observe(seq, K, 0)  # the probe's drafts rejected: another probe_interval steps without drafts
    assert [_room(seq) for _ in range(CONFIG.probe_interval)] == [0] * CONFIG.probe_interval
    assert _room(seq) == K
    observe(seq, K, K)  # the output copies again: every draft kept
    assert seq.draft_acceptance >= CONFIG.min_acceptance
    assert all(_room(seq) == K for _ in range(20))


def test_partly_kept_drafts_keep_drafting_and_zero_turns_the_rule_off():
    seq = _seq()
    for _ in range(50):  # one draft of four kept, every time: 25% pays for its rows
        assert _room(seq) == K
        observe(seq, K, 1)
    assert abs(seq.draft_acceptance - 0.25) < 1e-6
    off = SpeculativeConfig(min_priority=0, min_acceptance=0)
    for _ in range(50):
        assert _room(seq, off) == K
        observe(seq, K, 0)


def test_draft_length_doubles_while_kept_whole_and_falls_back_on_rejection():
    config = SpeculativeConfig(num_speculative_tokens=K, max_num_speculative_tokens=12, min_priority=0)
    seq = _seq()
    lengths = []
    for _ in range(4):  # every draft kept: 4, 8, then 12 (the cap) twice
        lengths.append(_room(seq, config))
        observe(seq, lengths[-1], lengths[-1])
    assert lengths == [4, 8, 12, 12]
    observe(seq, 12, 7)  # seven of twelve kept: the copied run ended, the next draft is k long
    assert _room(seq, config) == K
    observe(seq, K, K)
    assert _room(seq, config) == 2 * K
    observe(seq, 2 * K, 1)  # one kept: back to k, never below it
    assert _room(seq, config) == K
    observe(seq, K, K)
    assert _room(seq, config) == 2 * K
    seq.token_ids += [7] * 58  # 58 of 64 output tokens: the bonus token is the 64th
    assert _room(seq, config) == 5  # the limit (8) gives way to max_tokens
    draft_model = SpeculativeConfig(method="draft_model", model="self", num_speculative_tokens=K)
    assert draft_model.max_draft_tokens == K  # a draft model drafts a fixed k
    assert SpeculativeConfig(num_speculative_tokens=3).max_draft_tokens == 12  # unset: GROWTH * k
