"""KV block groups: one block pool per layer type, for models that mix sliding and full layers.

A block of the plain cache holds every layer's K/V, so a model whose layers all attend to the whole
sequence, or all slide, has one pool (one `BlockManager`). Gemma 2 and 3, Qwen with
`max_window_layers` and gpt-oss mix the two: their full layers need every token's K/V, their
sliding layers only the last `window`. Here the sliding layers' caches are a pool of their own,
with a block table of their own per sequence (`Sequence.sliding_block_table`), managed by a second
`BlockManager` that releases blocks out of the window; the full layers keep `Sequence.block_table`.
A decoding sequence then holds at most ceil(window / block_size) + 1 sliding blocks, however long.

`HybridBlockManager` gives the scheduler the same verbs as `BlockManager` over both pools: a
sequence can start or grow only where both can; prefix hits are the longest prefix both pools hold
(the sliding pool: the blocks in the window before the hit's end). Block copies (swap) come back in
one id space: the sliding pool's device and host blocks follow the full pool's (ids offset by the
full pool's sizes), so a step plan stays a list of pairs; the model runner splits them again.

Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.block_manager import BlockManager
from engine.request import Sequence

SLIDING_TABLE = "sliding_block_table"


def sliding_pool_blocks(
    num_blocks: int, block_size: int, window: int, max_num_seqs: int, max_num_batched_tokens: int
) -> int:
    """Blocks the sliding pool needs at most: every running sequence's window plus the block it
    grows into, one more while a step appends before its commit releases, and a step's new tokens
    (a prefill chunk's window-deep context is in the first term). Never more than the full pool."""
    per_seq = -(-window // block_size) + 2
    return min(num_blocks, max_num_seqs * per_seq + -(-max_num_batched_tokens // block_size))


def split_budget(layer_blocks: int, num_full: int, num_sliding: int, sliding_need: int) -> tuple[int, int]:
    """(full pool blocks, sliding pool blocks) from a budget of `layer_blocks` one-layer blocks: the
    sliding pool gets what it can use (`sliding_need`), the full pool the rest, or both the same
    count where the budget holds fewer."""
    even = layer_blocks // (num_full + num_sliding)
    if even >= sliding_need:
        return (layer_blocks - sliding_need * num_sliding) // num_full, sliding_need
    return even, even


class HybridBlockManager:
    """The paired verbs of `BlockManager` over a full-attention pool and a sliding-window pool."""

    def __init__(self, full: BlockManager, sliding: BlockManager):
        assert sliding.sliding_window and not full.sliding_window
        assert sliding.table_name == SLIDING_TABLE and full.table_name != SLIDING_TABLE
        self.full, self.sliding = full, sliding
        self.block_size = full.block_size
        self.enable_prefix_caching = full.enable_prefix_caching
        self.sliding_window = sliding.sliding_window

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """The full pool's: it bounds a sequence's length and the scheduler's watermark."""
        return self.full.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """The full pool's free blocks, or none while the sliding pool cannot take one more
        sequence's window (what the scheduler's room estimates read)."""
        per_seq = self.sliding.blocks_needed(self.sliding_window) + 1
        return self.full.num_free_blocks if self.sliding.num_free_blocks >= per_seq else 0

    @property
    def num_used_blocks(self) -> int:
        return self.full.num_used_blocks + self.sliding.num_used_blocks

    @property
    def num_host_blocks(self) -> int:
        return self.full.num_host_blocks

    @property
    def num_free_host_blocks(self) -> int:
        return self.full.num_free_host_blocks

    @property
    def num_prefix_hit_tokens(self) -> int:
        return self.full.num_prefix_hit_tokens

    def blocks_needed(self, num_tokens: int) -> int:
        return self.full.blocks_needed(num_tokens)

    def num_held_blocks(self, seq: Sequence) -> int:
        return self.full.num_held_blocks(seq) + self.sliding.num_held_blocks(seq)

    def is_swapped(self, seq: Sequence) -> bool:
        return self.full.is_swapped(seq)

    def num_restored_tokens(self, seq: Sequence, hits: list[int]) -> int:
        return self.full.num_restored_tokens(seq, hits)

    def prefix_hits(self, seq: Sequence) -> list[int]:
        """The full pool's hits, cut to the longest prefix the sliding pool also holds (the blocks
        its end's window reaches). A swapped-out sequence's sliding blocks all come from host."""
        hits = self.full.prefix_hits(seq)
        if hits and not self.is_swapped(seq):
            hits = hits[: len(self.sliding.prefix_hits(seq, limit=len(hits)))]
        return hits

    def _sliding_hits(self, seq: Sequence, hits: list[int]) -> list[int]:
        """The sliding pool's entries for the hit `prefix_hits` gave (nothing changed since)."""
        if not hits or self.is_swapped(seq):
            return []
        sliding = self.sliding.prefix_hits(seq, limit=len(hits))
        assert len(sliding) == len(hits), "the prefix cache changed between prefix_hits and allocate"
        return sliding

    def can_allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int, reserve: int = 0) -> bool:
        # the watermark in proportion to each pool's size
        sliding_reserve = reserve * self.sliding.num_blocks // self.full.num_blocks
        return self.full.can_allocate(seq, hits, num_new_tokens, reserve) and self.sliding.can_allocate(
            seq, self._sliding_hits(seq, hits), num_new_tokens, sliding_reserve
        )

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.full.can_append(seq, num_new_tokens) and self.sliding.can_append(seq, num_new_tokens)

    def can_swap_out(self, seq: Sequence) -> bool:
        return self.full.can_swap_out(seq) and self.sliding.can_swap_out(seq)

    # ---- mutations -----------------------------------------------------------------------
    def allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> list[tuple[int, int]]:
        sliding_hits = self._sliding_hits(seq, hits)
        copies = self.full.allocate(seq, hits, num_new_tokens)
        return copies + self._offset(self.sliding.allocate(seq, sliding_hits, num_new_tokens), True)

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        self.full.append(seq, num_new_tokens)
        self.sliding.append(seq, num_new_tokens)

    def trim(self, seq: Sequence) -> None:
        self.full.trim(seq)
        self.sliding.trim(seq)

    def commit(self, seq: Sequence) -> None:
        self.full.commit(seq)
        self.sliding.commit(seq)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        computed = seq.num_computed_tokens  # the first free() resets it
        pairs = self.full.swap_out(seq)
        seq.num_computed_tokens = computed
        return pairs + self._offset(self.sliding.swap_out(seq), False)

    def begin_step(self) -> None:
        self.full.begin_step()
        self.sliding.begin_step()

    def free(self, seq: Sequence) -> None:
        self.full.free(seq)
        self.sliding.free(seq)

    def _offset(self, pairs: list[tuple[int, int]], swap_in: bool) -> list[tuple[int, int]]:
        """The sliding pool's (source, destination) pairs in the shared id space."""
        dev, host = self.full.num_blocks, self.full.num_host_blocks
        if swap_in:
            return [(h + host, d + dev) for h, d in pairs]
        return [(d + dev, h + host) for d, h in pairs]

    # ---- accounting ----------------------------------------------------------------------
    def utilization(self, seqs: Iterable[Sequence]) -> float:
        return self.full.utilization(seqs)


def split_pairs(
    pairs: list[tuple[int, int]], num_blocks: int, num_host_blocks: int, swap_in: bool
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """A plan's pairs in the shared id space -> (the full pool's pairs, the sliding pool's)."""
    full: list[tuple[int, int]] = []
    sliding: list[tuple[int, int]] = []
    for a, b in pairs:
        dev = b if swap_in else a
        if dev < num_blocks:
            full.append((a, b))
        elif swap_in:
            sliding.append((a - num_host_blocks, b - num_blocks))
        else:
            sliding.append((a - num_blocks, b - num_host_blocks))
    return full, sliding


Blocks = BlockManager | HybridBlockManager  # what the scheduler allocates KV blocks from
