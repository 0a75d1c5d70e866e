"""Paged KV blocks: allocation on demand, reference counts and hash-based prefix sharing.

Plain Python, no torch. A block holds `block_size` token slots of every layer's K and V. A full
block whose tokens are known is registered under a chained hash (hash of the previous block's hash,
its tokens and an extra key such as the LoRA adapter), so a later sequence with the same prefix
reuses it instead of recomputing it. Freed blocks keep their hash until they are handed out again,
so a recently finished prefix is still found (an LRU cache of free blocks).

Swap: `num_host_blocks` host blocks hold the KV of swapped-out sequences. `swap_out` maps each
block holding a victim's computed tokens to a host block and frees the device blocks (the victim
keeps num_computed_tokens); `allocate` of a swapped-out sequence takes its leading blocks from the
prefix cache where they are still there and fresh blocks for the rest, mapped from their host
blocks. Both return (source, destination) block pairs; the model runner copies them before the
step's forward, swap-outs first (a block freed by a swap-out may be refilled in the same step).
Host blocks read by a swap-in return to the pool only at the next `begin_step`, so that a swap-out
later in the same step cannot overwrite them before they are read.

Sliding windows (`sliding_window` > 0: every layer of this manager's pool slides): once a block's
tokens all fall out of the window of the sequence's next token, `commit` releases it and its table
entry becomes `OUT_OF_WINDOW` (the attention never reads it; the model runner passes block 0
there). A sequence then holds at most ceil(window / block_size) + 1 blocks. A swapped-out sequence
keeps its released entries released; a prefix hit needs only the blocks its end's window reaches.
A model that mixes sliding and full layers has one manager per layer type (engine/kv_groups.py),
each over its own `Sequence` table (`table`).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.request import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = field(default=())


class _Blocks(dict[int, Block]):
    """Block id -> Block, each made on first use: the cache of a small model holds 10^5 blocks or more,
    which a list of Block objects takes a second to build."""

    def __init__(self, num_blocks: int):
        super().__init__()
        self.num_blocks = num_blocks

    def __missing__(self, block_id: int) -> Block:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block {block_id} out of range (num_blocks {self.num_blocks})")
        block = self[block_id] = Block(block_id)
        return block


OUT_OF_WINDOW = -1  # a block-table entry whose block was released (sliding window)


class TableChanges(dict[int, tuple[Sequence, int]]):
    """The block-table entries changed since a reader last looked: id(seq) -> (seq, its first
    changed entry). Entries past the table's end (after `trim` or `free`) are stale, not changed.
    A manager records into one only where a reader of its tables (engine/block_tables.py) asked."""

    def touch(self, seq: Sequence, first: int) -> None:
        old = self.get(id(seq))
        if old is None or first < old[1]:
            self[id(seq)] = (seq, first)


def chain_hash(prev: int | None, token_ids: tuple[int, ...], extra: str | None) -> int:
    return hash((prev, token_ids, extra))


class BlockManager:
    """Hands out KV blocks to sequences. Paired verbs: can_allocate/allocate, can_append/append,
    can_swap_out/swap_out, free."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        num_host_blocks: int = 0,
        sliding_window: int = 0,
        table: str = "block_table",
    ):
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        if num_host_blocks < 0:
            raise ValueError("num_host_blocks must be non-negative")
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.table_name = table  # the Sequence field holding this manager's block ids
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = _Blocks(num_blocks)
        self.hash_to_block: dict[int, int] = {}
        # Free blocks in the order they were freed: the oldest is handed out first.
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # Per sequence: (leading blocks already hashed, the last one's chain hash). The hash is kept
        # here, not read from a block, because that block may have been released out of the window.
        self._hashed: dict[str, tuple[int, int | None]] = {}
        self.num_prefix_hit_tokens = 0
        self.num_host_blocks = num_host_blocks
        self.free_host_ids: list[int] = list(range(num_host_blocks))  # a heap: low ids first, long runs
        # request id -> host blocks of its computed tokens (None: a block released out of the window)
        self._swapped: dict[str, list[int | None]] = {}
        self._host_in_flight: list[int] = []  # host blocks read by this step's swap-ins
        self.changes: TableChanges | None = None  # where table changes are recorded, if anywhere

    # ---- queries -------------------------------------------------------------------------
    def table(self, seq: Sequence) -> list[int]:
        """seq's block table in this manager's pool."""
        table: list[int] = getattr(seq, self.table_name)
        return table

    @property
    def num_blocks(self) -> int:
        return self.blocks.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.blocks.num_blocks - len(self.free_ids)

    @property
    def num_free_host_blocks(self) -> int:
        return len(self.free_host_ids)

    def num_held_blocks(self, seq: Sequence) -> int:
        """Device blocks seq holds (blocks released out of its sliding window not counted)."""
        return sum(1 for b in self.table(seq) if b != OUT_OF_WINDOW)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def is_swapped(self, seq: Sequence) -> bool:
        """Is seq's KV in host blocks (swapped out, waiting to be allocated again)?"""
        return seq.request_id in self._swapped

    def host_blocks(self, seq: Sequence) -> list[int | None]:
        """The host blocks holding a swapped-out seq's computed tokens (empty unless swapped out; None
        for a block released out of the sliding window before the swap-out)."""
        return list(self._swapped.get(seq.request_id, ()))

    def num_restored_tokens(self, seq: Sequence, hits: list[int]) -> int:
        """Tokens seq will not compute when allocated with `hits`: its cached prefix, or for a
        swapped-out sequence everything it had computed."""
        return seq.num_computed_tokens if self.is_swapped(seq) else len(hits) * self.block_size

    def prefix_hits(self, seq: Sequence, limit: int | None = None) -> list[int]:
        """Ids of cached blocks holding seq's leading full blocks (at most `limit` of them). At least
        one token is always left to compute, because the step must produce the last position's
        logits. With a sliding window a hit of h blocks needs only the blocks the window of token
        h * block_size reaches: the earlier ones are OUT_OF_WINDOW entries, cached or not."""
        if not self.enable_prefix_caching or seq.needs_prompt_logits and not self.is_swapped(seq):
            return []  # prompt logprobs need every prompt position computed
        if self.sliding_window and self.is_swapped(seq):
            return []  # everything it holds comes back from its host blocks
        bs, prev = self.block_size, None
        found: list[int | None] = []
        end = seq.num_tokens - 1 - (bs - 1)  # full blocks before the last token
        if self.is_swapped(seq):  # only blocks of tokens it had computed (the rest come from host)
            end = min(end, seq.num_computed_tokens - bs + 1)
        if limit is not None:
            end = min(end, limit * bs - bs + 1)
        for start in range(0, max(end, 0), bs):
            tokens = tuple(seq.token_ids[start : start + bs])
            prev = chain_hash(prev, tokens, seq.lora)
            block_id = self.hash_to_block.get(prev)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                if not self.sliding_window:
                    break
                block_id = None
            found.append(block_id)
        for h in range(len(found), 0, -1):  # the longest hit whose window blocks are all cached
            first = self._first_in_window(h * bs) if self.sliding_window else 0
            hit = [b for b in found[first:h] if b is not None]
            if len(hit) == h - first:
                return [OUT_OF_WINDOW] * first + hit
        return []

    def _first_in_window(self, position: int) -> int:
        """The first block the sliding window of the token at `position` reaches."""
        return max(0, position - self.sliding_window + 1) // self.block_size

    def can_allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int, reserve: int = 0) -> bool:
        """Can seq start with `hits` shared and `num_new_tokens` computed now, keeping `reserve` free?"""
        cached = self.num_restored_tokens(seq, hits)
        fresh = self.blocks_needed(cached + num_new_tokens) - len(hits)
        host = self._swapped.get(seq.request_id, ())
        fresh -= sum(1 for h in host[len(hits) :] if h is None)  # released out of the window: none
        # cached but on the free list
        revived = sum(1 for b in hits if b != OUT_OF_WINDOW and self.blocks[b].ref_count == 0)
        return fresh + revived + reserve <= self.num_free_blocks

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(self.table(seq))
        return need <= self.num_free_blocks

    def can_swap_out(self, seq: Sequence) -> bool:
        """Is there host room for the blocks of seq's computed tokens (and anything to keep)?"""
        n = self.blocks_needed(seq.num_computed_tokens)
        held = sum(1 for b in self.table(seq)[:n] if b != OUT_OF_WINDOW)
        return 0 < n and held <= len(self.free_host_ids)

    # ---- mutations -----------------------------------------------------------------------
    def allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> list[tuple[int, int]]:
        """Give a waiting sequence its shared prefix blocks plus fresh ones for its first chunk.
        A swapped-out sequence gets fresh blocks for what `hits` do not cover, to be filled from
        its host blocks: returns those (host block, device block) pairs (empty for any other)."""
        assert not self.table(seq), f"{seq.request_id} already holds blocks"
        self._touch(seq, 0)
        for block_id in hits:
            if block_id == OUT_OF_WINDOW:  # out of the window of the hit's end: not needed
                self.table(seq).append(block_id)
                continue
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_ids[block_id]
            block.ref_count += 1
            self.table(seq).append(block_id)
        prev = None  # the hits' chain hash, computed from their tokens (an entry may be released)
        for start in range(0, len(hits) * self.block_size, self.block_size):
            prev = chain_hash(prev, tuple(seq.token_ids[start : start + self.block_size]), seq.lora)
        self._hashed[seq.request_id] = (len(hits), prev)
        host = self._swapped.pop(seq.request_id, None)
        swap_in: list[tuple[int, int]] = []
        if host is None:
            seq.num_computed_tokens = len(hits) * self.block_size
            self.num_prefix_hit_tokens += seq.num_computed_tokens  # tokens not computed (again)
        else:  # computed tokens stay computed: hits where the prefix cache has them, else host copies
            self._host_in_flight += [h for h in host if h is not None]
            for host_id in host[len(hits) :]:
                if host_id is None:  # released out of the window before the swap-out
                    self.table(seq).append(OUT_OF_WINDOW)
                    continue
                block_id = self._take_free()
                self.table(seq).append(block_id)
                swap_in.append((host_id, block_id))
        seq.num_cached_tokens = seq.num_computed_tokens
        self.append(seq, num_new_tokens)
        return swap_in

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make room for seq's next `num_new_tokens` KV entries."""
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(self.table(seq))
        if need > 0:
            self._touch(seq, len(self.table(seq)))
        for _ in range(need):
            self.table(seq).append(self._take_free())

    def trim(self, seq: Sequence) -> None:
        """Give back seq's blocks past its computed tokens (slots of rejected speculative drafts:
        fresh, unshared, unregistered); they are handed out first again."""
        keep = self.blocks_needed(seq.num_computed_tokens)
        if len(self.table(seq)) > keep:
            self._touch(seq, keep)
        while len(self.table(seq)) > keep:
            block_id = self.table(seq).pop()
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count == 0 and block.hash is None, f"block {block_id} is not a fresh tail"
            self.free_ids[block_id] = None
            self.free_ids.move_to_end(block_id, last=False)

    def commit(self, seq: Sequence) -> None:
        """Register the blocks seq has just filled (its KV is now written) for prefix sharing, and
        release those out of its sliding window."""
        self._commit(seq)
        if self.sliding_window:
            self._release_out_of_window(seq)

    def _release_out_of_window(self, seq: Sequence) -> None:
        # the next token, at position num_computed_tokens, sees keys from num_computed - window + 1
        for i in range(self._first_in_window(seq.num_computed_tokens)):
            block_id = self.table(seq)[i]
            if block_id == OUT_OF_WINDOW:
                continue
            self._release(block_id)
            self.table(seq)[i] = OUT_OF_WINDOW
            self._touch(seq, i)

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed twice"
        if block.ref_count == 0:
            self.free_ids[block_id] = None

    def _commit(self, seq: Sequence) -> None:
        if not self.enable_prefix_caching:
            return
        bs, table = self.block_size, self.table(seq)
        done, prev = self._hashed.get(seq.request_id, (0, None))
        full = seq.num_computed_tokens // bs
        for i in range(done, full):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            prev = chain_hash(prev, tokens, seq.lora)
            if table[i] == OUT_OF_WINDOW:  # released (swapped out) before it was registered
                continue
            block = self.blocks[table[i]]
            if block.hash is None:  # a shared block is already registered
                block.hash, block.token_ids = prev, tokens
                self.hash_to_block.setdefault(prev, block.block_id)
        if full > done:
            self._hashed[seq.request_id] = (full, prev)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Preempt seq by swap: map the blocks of its computed tokens to host blocks and free its
        device blocks; it keeps num_computed_tokens. Returns the (device block, host block) pairs
        to copy before this step's forward. Check can_swap_out first."""
        assert self.can_swap_out(seq), f"no host room to swap out {seq.request_id}"
        computed = seq.num_computed_tokens
        n = self.blocks_needed(computed)
        host = [
            None if b == OUT_OF_WINDOW else heapq.heappop(self.free_host_ids) for b in self.table(seq)[:n]
        ]
        pairs = [(b, h) for b, h in zip(self.table(seq)[:n], host) if h is not None]
        self.free(seq)
        seq.num_computed_tokens = computed
        self._swapped[seq.request_id] = host
        return pairs

    def begin_step(self) -> None:
        """A new step is being planned: the last step's swap-ins have been copied."""
        for host_id in self._host_in_flight:
            heapq.heappush(self.free_host_ids, host_id)
        self._host_in_flight.clear()

    def free(self, seq: Sequence) -> None:
        """Release every block of seq, device and host (finish, abort or preemption by recompute).
        Device blocks last freed are reused last."""
        for host_id in self._swapped.pop(seq.request_id, ()):
            if host_id is not None:
                heapq.heappush(self.free_host_ids, host_id)
        for block_id in reversed(self.table(seq)):
            if block_id != OUT_OF_WINDOW:
                self._release(block_id)
        self.table(seq).clear()
        self._touch(seq, 0)
        seq.num_computed_tokens = 0
        self._hashed.pop(seq.request_id, None)

    def _touch(self, seq: Sequence, first: int) -> None:
        if self.changes is not None:
            self.changes.touch(seq, first)

    def _take_free(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    # ---- accounting ----------------------------------------------------------------------
    def utilization(self, seqs: Iterable[Sequence]) -> float:
        """Real tokens / allocated slots over the given sequences' blocks (shared blocks once)."""
        blocks: dict[int, int] = {}
        for seq in seqs:
            for i, block_id in enumerate(self.table(seq)):
                if block_id == OUT_OF_WINDOW:
                    continue
                filled = min(self.block_size, max(0, seq.num_computed_tokens - i * self.block_size))
                blocks[block_id] = max(blocks.get(block_id, 0), filled)
        slots = len(blocks) * self.block_size
        return sum(blocks.values()) / slots if slots else 1.0
