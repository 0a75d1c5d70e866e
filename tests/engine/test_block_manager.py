import pytest

from engine.block_manager import OUT_OF_WINDOW, BlockManager
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


def test_a_sliding_prefix_hit_needs_only_the_blocks_its_window_reaches():
    bm = BlockManager(16, 4, sliding_window=8)
    a = seq("a", range(100, 125))  # 25 tokens: six full blocks, then one token
    bm.allocate(a, [], a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.commit(a)  # registers six blocks, then releases the four out of the window of token 25
    assert a.block_table[:4] == [OUT_OF_WINDOW] * 4 and bm.num_held_blocks(a) == 3
    bm.free(a)
    b = seq("b", list(range(100, 124)) + [7])
    hits = bm.prefix_hits(b)  # a hit of 6 blocks: token 24's window starts at 17, in block 4
    assert hits[:4] == [OUT_OF_WINDOW] * 4 and len(hits) == 6 and OUT_OF_WINDOW not in hits[4:]
    assert bm.can_allocate(b, hits, 1)
    bm.allocate(b, hits, 1)
    assert b.num_computed_tokens == 24 and b.block_table[:4] == [OUT_OF_WINDOW] * 4
    assert bm.num_held_blocks(b) == 3  # two shared blocks and a fresh one for token 24
    b.token_ids += [8, 9, 10]
    b.num_computed_tokens = 28
    bm.append(b, 0)
    bm.commit(b)  # the hash chain goes on through the released entries: block 6 is registered
    c = seq("c", list(range(100, 124)) + [7, 8, 9, 10, 11])
    assert bm.prefix_hits(c)[-1] == b.block_table[6]
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_a_sliding_prefix_hit_shrinks_to_where_its_window_is_cached():
    bm = BlockManager(16, 4, sliding_window=8)
    a = seq("a", range(100, 125))
    bm.allocate(a, [], a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.commit(a)
    last = a.block_table[5]
    bm.free(a)
    block = bm.blocks[last]
    del bm.hash_to_block[block.hash]  # block 5 is gone from the cache: the hit can end at block 4
    hits = bm.prefix_hits(seq("b", list(range(100, 124)) + [7]))
    assert len(hits) == 5 and hits[:3] == [OUT_OF_WINDOW] * 3 and OUT_OF_WINDOW not in hits[3:]


def test_a_sliding_swap_out_needs_host_room_only_for_the_blocks_held():
    bm = BlockManager(16, 4, num_host_blocks=3, sliding_window=8)
    a = seq("a", range(100, 125))
    bm.allocate(a, [], a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.commit(a)
    assert bm.can_swap_out(a)  # 7 blocks of computed tokens, 3 held
    pairs = bm.swap_out(a)
    assert len(pairs) == 3 and bm.num_free_blocks == 16
    other = seq("other", range(48))
    bm.allocate(other, [], 48)  # 12 blocks: 4 left, enough for a's 3 held blocks and its next token
    assert bm.can_allocate(a, bm.prefix_hits(a), 1) and not bm.can_allocate(a, [], 9)
    assert len(bm.allocate(a, bm.prefix_hits(a), 1)) == 3 and a.block_table[:4] == [OUT_OF_WINDOW] * 4
    bm.begin_step()
    bm.free(a)
    bm.free(other)
    assert bm.num_free_blocks == 16 and bm.num_free_host_blocks == 3
