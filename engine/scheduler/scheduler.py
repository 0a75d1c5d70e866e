"""Iteration-level (continuous) batching.

Every step: running sequences first (a decode is one token, an unfinished prefill its next chunk),
in admission order; when blocks run out the policy's victim (default: the newest) is preempted by
recompute. Then, if nothing was preempted, waiting sequences are admitted while the token budget,
the sequence cap and the KV blocks allow. Prefills and decodes go into one forward.
"""
from __future__ import annotations

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.request import Sequence, SequenceStatus
from engine.scheduler.plan import ScheduledSeq, StepPlan
from engine.scheduler.policy import SchedulingPolicy, make_policy


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, policy: SchedulingPolicy | None = None):
        self.config = config
        self.bm = block_manager
        self.policy = policy or make_policy(config.policy)
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._reserve = int(config.watermark * block_manager.num_blocks)

    @property
    def num_waiting(self) -> int:
        return len(self.policy)

    def has_unfinished(self) -> bool:
        return bool(self.running) or len(self.policy) > 0

    def has_room(self) -> bool:
        """Could a new request start at the next step?"""
        return (
            len(self.policy) == 0
            and len(self.running) < self.config.max_num_seqs
            and self.bm.num_free_blocks > self._reserve + len(self.running)
        )

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.policy.add(seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.bm.can_append(seq, n):
                victim = self.policy.victim(self.running[i:])
                self._preempt(victim, plan)
                if victim is seq:
                    break
            else:
                self.bm.append(seq, n)
                plan.scheduled.append(ScheduledSeq(seq, n))
                self.policy.on_scheduled(seq, n)
                budget -= n
                i += 1
        if not plan.preempted:
            self._admit(plan, budget)
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> None:
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.policy.peek()
            if seq is None:
                return
            hits = self.bm.prefix_hits(seq)
            remaining = seq.num_tokens - len(hits) * self.bm.block_size
            if remaining > budget and not self.config.chunked_prefill:
                return
            n = min(remaining, budget)
            reserve = self._reserve if self.running else 0  # an idle engine always starts the head
            if not self.bm.can_allocate(seq, hits, n, reserve=reserve):
                return
            self.policy.pop()
            self.bm.allocate(seq, hits, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            plan.scheduled.append(ScheduledSeq(seq, n))
            self.policy.on_scheduled(seq, n)
            budget -= n

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        """Preempt by recompute: free the blocks; the sequence keeps its tokens and its place."""
        self.running.remove(seq)
        self.bm.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.policy.add_preempted(seq)
        plan.preempted.append(seq)

    def finish_step(self, plan: StepPlan) -> None:
        """The forward ran: advance every scheduled sequence and register its filled blocks."""
        for item in plan.scheduled:
            item.seq.num_computed_tokens += item.num_tokens
            self.bm.commit(item.seq)

    def finish(self, seq: Sequence) -> None:
        """seq is done (stopped or aborted): drop it from the running set or the queue, free blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.bm.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.policy.remove(seq)
        seq.status = SequenceStatus.FINISHED
