"""The scheduler's decisions on hand-built states: plain Python, no model."""

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.request import SamplingParams, Sequence, SequenceStatus
from engine.scheduler import Scheduler


def make(num_blocks=16, block_size=4, **cfg) -> Scheduler:
    return Scheduler(
        SchedulerConfig(block_size=block_size, watermark=0, **cfg), BlockManager(num_blocks, block_size)
    )


def seq(rid: str, n: int) -> Sequence:
    return Sequence(rid, list(range(1000 + len(rid) * 7, 1000 + len(rid) * 7 + n)), n, SamplingParams())


def run_step(s: Scheduler, sample=True):
    """Pretend the model ran: advance, and append a token to every sequence that sampled."""
    plan = s.schedule()
    samplers = [it.seq for it in plan.scheduled if it.samples]
    s.finish_step(plan)
    if sample:
        for q in samplers:
            q.token_ids.append(7)
    return plan


def test_prefills_and_decodes_share_a_step():
    s = make(max_num_batched_tokens=32)
    a = seq("a", 5)
    s.add(a)
    run_step(s)
    b = seq("bb", 9)
    s.add(b)
    plan = run_step(s)
    assert [(it.seq.request_id, it.num_tokens) for it in plan.scheduled] == [("a", 1), ("bb", 9)]


def test_token_budget_chunks_long_prompts_and_decodes_continue():
    s = make(num_blocks=32, max_num_batched_tokens=8)
    a = seq("a", 3)
    s.add(a)
    run_step(s)
    long = seq("long", 20)
    s.add(long)
    chunks = []
    while long.num_computed_tokens < 20:
        plan = run_step(s)
        assert plan.num_tokens <= 8
        assert ("a", 1) in [(it.seq.request_id, it.num_tokens) for it in plan.scheduled]  # decode every step
        chunks += [it.num_tokens for it in plan.scheduled if it.seq is long]
    assert chunks == [7, 7, 6]
    assert long.num_tokens == 21  # sampled only after its last chunk


def test_max_num_seqs_caps_admission():
    s = make(max_num_seqs=2)
    for r in "abc":
        s.add(seq(r, 2))
    plan = run_step(s)
    assert len(plan.scheduled) == 2 and s.num_waiting == 1


def test_kv_exhaustion_preempts_newest_by_recompute_and_it_keeps_its_place():
    s = make(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a, b = seq("a", 8), seq("bb", 8)
    s.add(a)
    s.add(b)
    run_step(s)  # 2 blocks each, all 4 used; both sampled a token (9 tokens each)
    c = seq("ccc", 2)
    s.add(c)  # arrives later than both
    plan = run_step(s)  # a needs a 3rd block -> b (newest) is preempted
    assert plan.preempted == [b]
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert b.num_tokens == 9  # kept its generated token
    assert s.policy.peek() is b  # ahead of c, which arrived after it
    assert [it.seq for it in plan.scheduled] == [a]  # nothing admitted in a step that preempted


def test_running_sequence_preempts_itself_when_alone():
    s = make(num_blocks=2, block_size=4)
    a = seq("a", 8)
    s.add(a)
    run_step(s, sample=True)
    plan = run_step(s)
    assert plan.preempted == [a] and not plan.scheduled


def test_finish_frees_blocks_and_abort_of_waiting():
    s = make()
    a, b = seq("a", 5), seq("bb", 5)
    s.add(a)
    run_step(s)
    s.add(b)
    s.finish(a)
    s.finish(b)
    assert s.block_manager.num_free_blocks == 16 and not s.has_unfinished()
    assert a.status is SequenceStatus.FINISHED and b.status is SequenceStatus.FINISHED


def test_has_room_counts_waiting_sequences_against_the_cap_and_the_blocks():
    s = make(num_blocks=8, max_num_seqs=3)
    assert s.has_room([])
    a, b = seq("a", 7), seq("bb", 7)  # 2 blocks each (with the first output slot)
    assert s.has_room([a, b])  # 4 of 8 blocks spoken for, 2 of 3 slots
    assert not s.has_room([a, b, seq("ccc", 7)])  # the sequence cap
    assert not s.has_room([a, seq("dddd", 23)])  # 2 + 6 = all 8 blocks, none left for growth
    s.add(a)
    run_step(s)
    assert s.has_room([]) and not s.has_room([b, seq("e", 2)])  # 1 running + 2 waiting = the cap
