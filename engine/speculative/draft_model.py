"""Drafts from a draft model: a smaller model of the target's vocabulary, or the target's own weights
quantized to INT8 ("self-draft"), decoding greedily over a shadow paged KV cache.

The shadow cache: every draft layer has a cache of the target's num_blocks and block_size, and a
sequence's draft KV lives at the same slots as its target KV (seq.block_table), so the block
manager keeps no books for the draft: blocks freed or preempted with the target are the draft's
too, and rejected drafts' slots are written again later. What the draft holds of a sequence is
tracked here (`_Fed`): the sequence's length when it last drafted and the drafts it fed. A round
feeds what is missing (the prompt on the first round, then the one or two tokens the target kept
beyond the draft's) as decode rows or one chunk, then k - 1 one-token decodes, each step batched
over the step's speculating sequences; the drafts are the draft model's argmax. A preempted
sequence (recompute or swap: its blocks change) starts over.

The drafts only ever change how many tokens a step keeps, never which: verification
(engine/speculative/verify.py) keeps exactly the target's greedy tokens, and for sampled requests
an argmax draft is a point mass, which is what the rejection rule there assumes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.block_tables import DeviceBlockTables
from engine.request import Sequence
from engine.scheduler.plan import PENDING_DRAFT
from engine.speculative.config import SpeculativeConfig
from engine.speculative.policy import draft_room
from engine.step_meta import attention_meta, step_to_device

if TYPE_CHECKING:
    from engine.models import LlamaModel
    from engine.models.decode import DecodeForward
    from engine.scheduler import ScheduledSeq, StepPlan

CATCH_UP_ROWS = 8  # catch-ups this short run as decode rows of the one-call forward; longer: chunks


@dataclass
class _Fed:
    """What the draft's cache holds of one sequence."""

    seq: Sequence
    num_tokens: int  # the sequence's length when the draft last ran (its KV: every position before)
    drafts: list[int]  # the drafts fed after it (their KV written at num_tokens, num_tokens + 1, ...)
    blocks: list[int]  # the block table then, over those positions


class DraftModelDrafter:
    """The scheduler's drafter for method "draft_model": at scheduling it reserves each speculating
    decode's k slots (PENDING_DRAFT entries); `complete` drafts them once the slots exist."""

    method = "draft_model"

    def __init__(
        self,
        config: SpeculativeConfig,
        model: LlamaModel,
        decode: DecodeForward | None,
        kv_caches: list[torch.Tensor],
        block_size: int,
        max_model_len: int,
        tables: DeviceBlockTables,
    ):
        self.config = config
        self.model = model
        self.decode = decode
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.tables = tables  # the target's block tables on the device: the same blocks hold the draft's KV
        self.max_model_len = max_model_len
        self.device = model.embed.device
        self._fed: dict[int, _Fed] = {}  # by id(sequence)
        # running totals: the seconds spent drafting, draft model forwards, tokens drafted
        self.seconds = 0.0
        self.forwards = 0
        self.tokens = 0

    def drafts(self, seq: Sequence, budget: int, num_running: int) -> list[int]:
        """k slots for `seq`'s drafts this step (policy.draft_room), to be drafted by `complete`."""
        return [PENDING_DRAFT] * draft_room(seq, self.config, budget, num_running, self.max_model_len)

    @torch.inference_mode()
    def complete(self, plan: StepPlan) -> None:
        """The drafts of the plan's speculating decodes, in place of their PENDING_DRAFT entries."""
        for seq in plan.preempted:  # its blocks change: what the shadow cache held of it is lost
            self._fed.pop(id(seq), None)
        for key in [key for key, fed in self._fed.items() if fed.seq.is_finished]:
            del self._fed[key]
        items = [it for it in plan.scheduled if it.draft and it.draft[0] == PENDING_DRAFT]
        if not items:
            return
        start = time.perf_counter()
        self._catch_up(items)
        for j in range(1, max(len(it.draft) for it in items)):
            step = [it for it in items if len(it.draft) > j]
            rows = [(it.seq, it.seq.num_tokens - 1 + j) for it in step]
            tokens = self._argmax([it.draft[j - 1] for it in step], [q for _, q in rows], rows, [])
            for it, token in zip(step, tokens):
                it.draft[j] = token
        for it in items:
            seq = it.seq
            fed = it.draft[:-1]
            last = seq.num_tokens + len(fed)
            self._fed[id(seq)] = _Fed(seq, seq.num_tokens, fed, seq.block_table[: self._blocks(last)])
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(it.draft) for it in items)

    def _catch_up(self, items: list[ScheduledSeq]) -> None:
        """Feed each sequence's tokens the draft has not seen; its first draft from the last one."""
        rows: list[tuple[Sequence, int]] = []  # decode rows first, then chunks
        row_ids: list[int] = []
        chunks: list[tuple[Sequence, int, int]] = []
        chunk_ids: list[int] = []
        last: list[tuple[bool, int]] = []  # each item's sampling row: (in a chunk, index)
        known = [min(self._known(it.seq), it.seq.num_tokens - 1) for it in items]
        # several rows of one sequence only in the one-call decode forward (each row sees the rows
        # before it there); where any catch-up needs a chunk, every catch-up longer than 1 is one
        short = self.decode is not None and all(
            it.seq.num_tokens - m <= CATCH_UP_ROWS for it, m in zip(items, known)
        )
        for it, m in zip(items, known):
            seq, n = it.seq, it.seq.num_tokens
            if n - m == 1 or short:
                rows += [(seq, q) for q in range(m, n)]
                row_ids += seq.token_ids[m:n]
                last.append((False, len(rows) - 1))
            else:
                chunks.append((seq, m, n - m))
                chunk_ids += seq.token_ids[m:n]
                last.append((True, len(chunk_ids) - 1))
        positions = [q for _, q in rows] + [q for _, s, m in chunks for q in range(s, s + m)]
        sample = [i + len(rows) if in_chunk else i for in_chunk, i in last]
        tokens = self._argmax(row_ids + chunk_ids, positions, rows, chunks, sample)
        for it, token in zip(items, tokens):
            it.draft[0] = token

    def _argmax(
        self,
        ids: list[int],
        positions: list[int],
        rows: list[tuple[Sequence, int]],
        chunks: list[tuple[Sequence, int, int]],
        sample: list[int] | None = None,
    ) -> list[int]:
        """One draft forward over decode `rows` and prefill `chunks` (`ids`, `positions`: theirs, in
        that order); the argmax token after each of the `sample` rows (None: every row)."""
        meta = attention_meta(self.block_size, rows, chunks, self.tables)
        input_ids, pos, meta = step_to_device(self.device, torch.tensor(ids), torch.tensor(positions), meta)
        if self.decode is not None and self.decode.applies(meta, self.kv_caches):
            hidden = self.decode(input_ids, pos, meta, self.kv_caches)  # [T, hidden]
        else:
            hidden = self.model.forward(input_ids, pos, meta, self.kv_caches)
        self.forwards += 1
        if sample is not None:
            hidden = hidden[torch.tensor(sample, device=hidden.device)]
        return self.model.logits(hidden).argmax(dim=-1).tolist()

    def _known(self, seq: Sequence) -> int:
        """How many of `seq`'s tokens the draft's cache holds: up to its last round's length, then
        the drafts it fed that the target kept; 0 where the sequence's blocks have changed since."""
        fed = self._fed.get(id(seq))
        if fed is None or fed.seq is not seq:
            return 0
        kept = seq.token_ids[fed.num_tokens : fed.num_tokens + len(fed.drafts)]
        m = 0
        while m < len(kept) and kept[m] == fed.drafts[m]:
            m += 1
        known = fed.num_tokens + m
        nb = self._blocks(known)
        return known if seq.block_table[:nb] == fed.blocks[:nb] else 0

    def _blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
