"""Block tables kept on the device (engine/block_tables.py), against the block manager's lists."""

from __future__ import annotations

import random

import pytest
import torch

from engine.block_manager import OUT_OF_WINDOW, BlockManager
from engine.block_tables import DeviceBlockTables
from engine.request import SamplingParams, Sequence


def seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, list(tokens), len(tokens), SamplingParams())


def assert_rows_match(tables: DeviceBlockTables, seqs: list[Sequence]) -> None:
    """Each sequence holding blocks has a row of its own whose first len(table) entries are its
    table (OUT_OF_WINDOW as 0), and gather reads the same; nobody else holds a row."""
    tables.sync()
    live = [s for s in seqs if tables.table(s)]
    rows = [tables.row(s) for s in live]
    assert len(set(rows)) == len(rows)
    assert sorted(id(s) for s in live) == sorted(tables.rows)
    for s in live:
        want = torch.tensor([max(b, 0) for b in tables.table(s)])
        assert torch.equal(tables.tensor[tables.row(s), : len(want)].cpu(), want), s.request_id
    if live:
        width = max(len(tables.table(s)) for s in live)
        got = tables.gather(live, width)
        for i, s in enumerate(live):
            n = len(tables.table(s))
            assert got[i, :n].tolist() == [max(b, 0) for b in tables.table(s)]


def test_a_decode_step_writes_only_the_blocks_it_allocated():
    """128 sequences of 257 blocks: a decode step copies its new blocks' entries, not 33k entries."""
    bm = BlockManager(128 * 300, 1, enable_prefix_caching=False)
    tables = DeviceBlockTables(8, torch.device("cpu"))  # rows and columns grow as needed
    tables.follow(bm)
    rng = random.Random(0)
    seqs = [seq(str(i), [rng.randrange(100) for _ in range(256)]) for i in range(128)]
    for s in seqs:
        bm.allocate(s, [], 256)
        s.num_computed_tokens = 256
    tables.sync()
    assert tables.last_written == 128 * 256
    for step in range(8):
        before = sum(len(s.block_table) for s in seqs)
        decoding = seqs if step % 2 else seqs[: 1 + step * 16]
        for s in decoding:
            s.num_computed_tokens = len(s.token_ids)
            s.token_ids.append(7)
            bm.append(s, 1)
        new = sum(len(s.block_table) for s in seqs) - before
        tables.sync()
        assert new == len(decoding) and tables.last_written == new
        assert_rows_match(tables, seqs)


def test_no_change_writes_nothing():
    bm = BlockManager(64, 4)
    tables = DeviceBlockTables(4, torch.device("cpu"))
    tables.follow(bm)
    s = seq("a", list(range(30)))
    bm.allocate(s, [], 30)
    tables.sync()
    written = tables.entries_written
    for _ in range(3):
        tables.sync()
        assert tables.last_written == 0
    assert tables.entries_written == written


@pytest.mark.parametrize("window,prefix,host", [(0, True, 64), (0, False, 0), (8, True, 64), (6, False, 32)])
@pytest.mark.parametrize("seed", range(4))
def test_random_allocate_append_trim_preempt_swap_fork_free(window, prefix, host, seed):
    """The device rows equal the manager's lists after every verb, in random order: allocation with
    prefix hits (n > 1 forks share a prompt), appends and commits (sliding releases), speculative
    tails trimmed, preemption by recompute and by swap, swap-ins, finishes."""
    rng = random.Random(seed)
    bs = 4
    bm = BlockManager(96, bs, enable_prefix_caching=prefix, num_host_blocks=host, sliding_window=window)
    tables = DeviceBlockTables(2, torch.device("cpu"), rows=2)
    tables.follow(bm)
    prompts = [[rng.randrange(5) for _ in range(rng.randint(1, 30))] for _ in range(4)]
    waiting: list[Sequence] = []
    running: list[Sequence] = []
    everyone: list[Sequence] = []
    for i in range(200):
        op = rng.random()
        if op < 0.2 or not running and not waiting:  # a new request, or a fork of an earlier prompt
            s = seq(f"r{i}", list(rng.choice(prompts)) + [rng.randrange(5) for _ in range(rng.randint(0, 9))])
            waiting.append(s)
            everyone.append(s)
        elif op < 0.4 and waiting:  # admit (a swapped-out one gets its host blocks back)
            s = waiting.pop(rng.randrange(len(waiting)))
            hits = bm.prefix_hits(s)
            new = s.num_tokens - bm.num_restored_tokens(s, hits)
            if new > 0 and bm.can_allocate(s, hits, new, reserve=2):
                bm.allocate(s, hits, new)
                s.num_computed_tokens += new
                bm.commit(s)
                running.append(s)
            else:
                waiting.append(s)
        elif op < 0.7 and running:  # a decode step of some, a few with speculative tails trimmed
            for s in rng.sample(running, rng.randint(1, len(running))):
                s.token_ids.append(rng.randrange(5))
                k = rng.choice([1, 1, 3])
                if not bm.can_append(s, k):
                    continue
                bm.append(s, k)
                s.num_computed_tokens += 1
                bm.trim(s)
                bm.commit(s)
        elif op < 0.85 and running:  # preempt: by swap where there is host room, else recompute
            s = running.pop(rng.randrange(len(running)))
            if host and bm.can_swap_out(s) and rng.random() < 0.6:
                bm.swap_out(s)
            else:
                bm.free(s)
            waiting.append(s)
        elif running:  # finish
            bm.free(running.pop(rng.randrange(len(running))))
        bm.begin_step()
        if rng.random() < 0.5:  # several verbs may fall between two syncs
            assert_rows_match(tables, everyone)
    assert_rows_match(tables, everyone)
    for s in running:
        bm.free(s)
    tables.sync()
    assert not tables.rows and bm.num_free_blocks == bm.num_blocks


def test_released_blocks_read_as_block_zero():
    bm = BlockManager(32, 2, sliding_window=4)
    tables = DeviceBlockTables(4, torch.device("cpu"))
    tables.follow(bm)
    s = seq("a", list(range(12)))
    bm.allocate(s, [], 12)
    s.num_computed_tokens = 12
    bm.commit(s)
    released = s.block_table.count(OUT_OF_WINDOW)
    assert released >= 3 and s.block_table[:released] == [OUT_OF_WINDOW] * released
    tables.sync()
    assert tables.tensor[tables.row(s), :6].tolist() == [0] * released + s.block_table[released:]
