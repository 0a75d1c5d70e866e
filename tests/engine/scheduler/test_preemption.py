"""Swap preemption decisions on hand-built states: plain Python, no model."""

import pytest
from helpers import run_step  # (the plan's block copies need no model here)

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.request import SamplingParams, Sequence, SequenceStatus
from engine.scheduler import Scheduler, SwapCost

CHEAP = SwapCost(fixed_s=0.0, block_s=1e-6)  # 2 blocks: 2 us, against 8 tokens * 0.2 ms to recompute


def make(mode="swap", num_blocks=4, host=8, swap_cost=CHEAP, block_size=4, **cfg) -> Scheduler:
    config = SchedulerConfig(
        block_size=block_size,
        watermark=0,
        preemption_mode=mode,
        num_swap_blocks=host,
        max_num_batched_tokens=cfg.pop("budget", 64),
        **cfg,
    )
    bm = BlockManager(num_blocks, block_size, num_host_blocks=host)
    return Scheduler(config, bm, swap_cost=swap_cost)


def seq(rid: str, tokens) -> Sequence:
    tokens = list(tokens)
    return Sequence(rid, tokens, len(tokens), SamplingParams())


def two_decoding(s: Scheduler):
    """a and b with 8-token prompts fill all 4 blocks and have sampled one token each."""
    a, b = seq("a", range(100, 108)), seq("b", range(200, 208))
    s.add(a)
    s.add(b)
    run_step(s)
    return a, b


def test_swap_out_copies_the_computed_blocks_and_keeps_the_progress():
    s = make("swap")
    a, b = two_decoding(s)
    old = list(b.block_table)
    plan = run_step(s)  # a needs a 3rd block: b (newest) is swapped out
    assert plan.preempted == [b] and s.num_swaps == 1
    assert plan.swap_out == list(zip(old, [0, 1])) and plan.swap_in == []
    assert b.status is SequenceStatus.WAITING and b.block_table == []
    assert (
        b.num_computed_tokens == 8
        and s.block_manager.host_blocks(b) == [0, 1]
        and s.block_manager.num_free_host_blocks == 6
    )
    assert s.block_manager.is_swapped(b) and s.policy.peek() is b


def test_swap_in_reuses_cached_prefix_blocks_copies_the_rest_and_decodes_on():
    s = make("swap")
    a, b = two_decoding(s)
    b0 = b.block_table[0]
    run_step(s)  # b swapped out; a took b's last block (freed first), b's first is still cached
    s.finish(a)
    plan = run_step(s)
    assert [(it.seq, it.num_tokens) for it in plan.scheduled] == [
        (b, 1)
    ]  # its next token, nothing recomputed
    assert b.block_table[0] == b0  # found in the prefix cache: no copy
    assert plan.swap_in == [(1, b.block_table[1])]  # only the reused block comes from host
    assert b.num_computed_tokens == 9 and not s.block_manager.is_swapped(b)
    run_step(s)  # the host blocks read by the swap-in are free again at the next step
    assert s.block_manager.num_free_host_blocks == 8


def test_auto_swaps_when_the_copy_is_cheaper_than_recomputation():
    s = make("auto")
    _, b = two_decoding(s)
    recompute, swap = s.preemption.estimate(b, s.block_manager)
    assert recompute == pytest.approx(8 * 0.0002) and swap == pytest.approx(2e-6)
    assert run_step(s).swap_out and s.block_manager.is_swapped(b)


def test_auto_recomputes_when_the_copy_is_dearer_or_unmeasured():
    for cost in (SwapCost(fixed_s=1.0, block_s=0.0), None):
        s = make("auto", swap_cost=cost)
        _, b = two_decoding(s)
        plan = run_step(s)
        assert plan.preempted == [b] and not plan.swap_out
        assert b.num_computed_tokens == 0 and not s.block_manager.is_swapped(b) and s.num_swaps == 0


def test_recompute_mode_never_swaps_and_full_swap_space_falls_back_to_recompute():
    for s in (make("recompute"), make("swap", host=1)):  # b needs 2 host blocks
        _, b = two_decoding(s)
        plan = run_step(s)
        assert plan.preempted == [b] and not plan.swap_out and b.num_computed_tokens == 0
        assert s.block_manager.num_free_host_blocks == s.block_manager.num_host_blocks


def test_preempted_mid_prefill_swaps_only_the_computed_blocks():
    s = make("swap", num_blocks=3, budget=8)
    a, b = seq("a", range(100, 103)), seq("b", range(200, 212))
    s.add(a)
    s.add(b)
    run_step(s)  # a: 3 tokens (1 block); b: its first 5 tokens (2 blocks)
    assert b.num_computed_tokens == 5
    plan = run_step(s)  # b's next chunk needs a 3rd block: none left, b is the newest
    assert plan.preempted == [b] and len(plan.swap_out) == 2 and b.num_computed_tokens == 5
    s.finish(a)
    plan = run_step(s)
    assert [(it.seq, it.num_tokens) for it in plan.scheduled] == [(b, 7)]  # the prefill goes on from 5
    assert b.num_computed_tokens == 12 and b.num_tokens == 13


def test_a_victim_sharing_prefix_blocks_copies_them_and_the_sharer_keeps_them():
    s = make("swap", num_blocks=6)
    system = list(range(300, 308))  # two full blocks
    a, c, b = seq("a", system + [1, 2]), seq("c", range(400, 407)), seq("b", system + [3, 4])
    for q in (a, c):
        s.add(q)
    run_step(s)
    s.add(b)
    run_step(s)  # b shares a's two prefix blocks: a 3 + c 2 + b 1 = all 6 blocks
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared and s.block_manager.blocks[shared[0]].ref_count == 2
    plan = run_step(s)  # c needs a 3rd block: b (newest) is swapped out
    assert plan.preempted == [b] and len(plan.swap_out) == 3  # the shared blocks are copied too
    assert all(s.block_manager.blocks[i].ref_count == 1 for i in shared)  # a keeps them
    for q in list(s.running):
        s.finish(q)
    plan = run_step(s)  # readmitted: the prefix is still cached on the device, only its own block is copied
    assert b.block_table[:2] == shared and len(plan.swap_in) == 1
    assert plan.swap_in[0][0] == 2  # its third host block (0 and 1 held the shared prefix)


def test_finishing_a_swapped_out_sequence_frees_its_host_blocks():
    s = make("swap")
    a, b = two_decoding(s)
    run_step(s)
    assert s.block_manager.num_free_host_blocks == 6
    s.finish(b)
    s.finish(a)
    assert b.status is SequenceStatus.FINISHED and not s.block_manager.is_swapped(b)
    assert (
        s.block_manager.num_free_host_blocks == 8
        and s.block_manager.num_free_blocks == 4
        and not s.has_unfinished()
    )


def test_host_blocks_read_by_a_swap_in_are_not_handed_out_in_the_same_step():
    bm = BlockManager(8, 4, num_host_blocks=2)
    a, b = seq("a", range(100, 108)), seq("b", range(200, 208))
    for q in (a, b):
        bm.allocate(q, [], 8)
        q.num_computed_tokens = 8
    bm.swap_out(a)  # host blocks 0, 1
    assert bm.allocate(a, [], 1) and not bm.can_swap_out(b)  # a's swap-in still reads 0 and 1
    bm.begin_step()
    assert bm.can_swap_out(b) and [h for _, h in bm.swap_out(b)] == [0, 1]
