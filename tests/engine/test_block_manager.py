import pytest

from engine.block_manager import BlockManager
from engine.request import SamplingParams, Sequence


def seq(rid: str, tokens: list[int], lora=None) -> Sequence:
    return Sequence(rid, list(tokens), len(tokens), SamplingParams(), lora=lora)


def test_allocate_on_demand_and_free_everything():
    bm = BlockManager(8, 4)
    s = seq("a", range(10))
    assert bm.can_allocate(s, [], 10)
    bm.allocate(s, [], 10)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    s.num_computed_tokens = 10
    for _ in range(3):  # grow token by token: a new block only every 4 tokens
        s.token_ids.append(1)
        bm.append(s, 1)
        s.num_computed_tokens += 1
    assert len(s.block_table) == 4
    bm.free(s)
    assert bm.num_free_blocks == 8 and s.block_table == []


def test_a_large_cache_counts_every_block_and_refuses_ids_outside_it():
    bm = BlockManager(1 << 20, 16)  # Block objects are made on first use
    assert bm.num_blocks == bm.num_free_blocks == 1 << 20 and bm.num_used_blocks == 0
    s = seq("a", range(40))
    bm.allocate(s, [], 40)
    assert s.block_table == [0, 1, 2] and bm.num_used_blocks == 3
    assert [bm.blocks[b].ref_count for b in s.block_table] == [1, 1, 1]
    assert bm.blocks[(1 << 20) - 1].ref_count == 0
    for block_id in (1 << 20, -1):
        with pytest.raises(IndexError):
            bm.blocks[block_id]


def test_can_allocate_respects_capacity_and_reserve():
    bm = BlockManager(3, 4)
    s = seq("a", range(12))
    assert bm.can_allocate(s, [], 12)
    assert not bm.can_allocate(s, [], 12, reserve=1)
    assert not bm.can_allocate(seq("b", range(13)), [], 13)


def test_prefix_blocks_are_shared_and_reference_counted():
    bm = BlockManager(16, 4)
    system = list(range(100, 112))  # three full blocks
    a = seq("a", system + [1, 2])
    bm.allocate(a, bm.prefix_hits(a), a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.commit(a)
    b = seq("b", system + [7, 8, 9])
    hits = bm.prefix_hits(b)
    assert hits == a.block_table[:3]
    bm.allocate(b, hits, b.num_tokens - 12)
    assert b.num_computed_tokens == 12 and b.num_cached_tokens == 12
    assert all(bm.blocks[i].ref_count == 2 for i in hits)
    assert bm.num_used_blocks == 5  # 3 shared + one tail block each
    bm.free(a)
    assert all(bm.blocks[i].ref_count == 1 for i in hits)
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_prefix_hits_leave_one_token_to_compute():
    bm = BlockManager(8, 4)
    a = seq("a", range(8))
    bm.allocate(a, [], 8)
    a.num_computed_tokens = 8
    bm.commit(a)
    b = seq("b", range(8))  # identical prompt, a multiple of the block size
    assert bm.prefix_hits(b) == a.block_table[:1]


def test_freed_prefix_is_still_found_until_reused():
    bm = BlockManager(4, 4)
    a = seq("a", range(9))
    bm.allocate(a, [], 9)
    a.num_computed_tokens = 9
    bm.commit(a)
    table = list(a.block_table)
    bm.free(a)
    b = seq("b", list(range(8)) + [42])
    assert bm.prefix_hits(b) == table[:2]
    # Reusing every block for unrelated tokens evicts the cached prefix.
    c = seq("c", [9] * 16)
    bm.allocate(c, [], 16)
    assert bm.prefix_hits(b) == []


def test_lora_adapter_is_part_of_the_prefix_key():
    bm = BlockManager(8, 4)
    a = seq("a", range(9), lora="x")
    bm.allocate(a, [], 9)
    a.num_computed_tokens = 9
    bm.commit(a)
    assert bm.prefix_hits(seq("b", range(9), lora="y")) == []
    assert len(bm.prefix_hits(seq("c", range(9), lora="x"))) == 2


def test_utilization_counts_real_tokens_over_allocated_slots():
    bm = BlockManager(8, 4)
    a = seq("a", range(6))
    bm.allocate(a, [], 6)
    a.num_computed_tokens = 6
    assert bm.utilization([a]) == 6 / 8
