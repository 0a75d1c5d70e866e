"""Iteration-level (continuous) batching, and the static and dynamic baselines (SchedulerConfig.batching).

Every step: running sequences first (a decode is one token, an unfinished prefill its next chunk),
in admission order (or the policy's, see begin_step); when blocks run out the policy's victim
(default: the newest) is preempted, by recompute or by swap (preemption.py). Then, if nothing was
preempted, waiting sequences are admitted while the token budget, the sequence cap and the KV
blocks allow; a head that cannot start may displace a running sequence if the policy says so
(priority tiers do, FCFS never). Requests the policy refuses (SLO-aware admission) are listed in
plan.refused. While urgent work is running or waiting, a step that prefills none of it is cut short,
and one that prefills it runs no other prefill chunk and leaves out the decodes it goes before
(urgent.py). Prefills and decodes go into one forward, after the plan's block copies (swap out, then
swap in). docs/scheduling.md describes the policies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from engine.config import SchedulerConfig
from engine.kv_groups import Blocks
from engine.request import Sequence, SequenceStatus
from engine.scheduler.cost_model import split
from engine.scheduler.load import SLOLoad
from engine.scheduler.plan import ScheduledSeq, StepPlan
from engine.scheduler.policy import SchedulingPolicy
from engine.scheduler.preemption import PreemptionChooser, SwapCost
from engine.scheduler.registry import make_policy, parse_policy
from engine.scheduler.room import FRESH_TENANT, Room
from engine.scheduler.urgent import UrgentSteps


class Drafter(Protocol):
    method: str  # the speculative decoding method, e.g. "ngram"

    def drafts(self, seq: Sequence, budget: int, num_running: int) -> list[int]:
        """`seq`'s drafts for this step's decode ([]: a plain decode). A drafter that computes them
        once their KV slots are allocated returns that many PENDING_DRAFT entries."""
        ...

    def complete(self, plan: StepPlan) -> None:
        """After scheduling, before the forward: the plan's PENDING_DRAFT entries become tokens."""
        ...


class Scheduler(UrgentSteps):
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: Blocks,
        policy: SchedulingPolicy | None = None,
        clock: Callable[[], float] | None = None,
        swap_cost: SwapCost | None = None,
        admit_check: Callable[[Sequence, list[Sequence]], bool] | None = None,
        drafter: Drafter | None = None,
    ):
        self.config = config
        # Policy-independent resource check on the head of the queue, e.g. "its LoRA adapter can
        # get a device slot" (engine/lora): False keeps it (and everything behind it) waiting.
        self.admit_check = admit_check
        self.block_manager = block_manager
        self.drafter = drafter  # speculative decoding's draft tokens for decodes (None: off)
        self.policy = policy if policy is not None else make_policy(config.policy, config, clock=clock)
        self.running: list[Sequence] = []
        self.num_swaps = 0  # preemptions by swap (the rest were by recompute)
        self.num_admissions = 0  # sequences moved from waiting to running, readmissions included
        self._reserve = int(config.watermark * block_manager.num_blocks)
        self._clock = clock or time.monotonic
        # static/dynamic batching: members of the current batch not admitted yet (continuous: unused)
        self._batch_left = 0
        self._starts: set[int] = set()  # ids of every sequence admitted in this step
        # Room.tokens bounds a worker's take (_prompt_tokens_left)
        self._bounded_take = config.batching == "continuous" and "vtc" in parse_policy(config.policy)
        self.observing = True  # measured steps feed the step-cost models (observe_step)
        UrgentSteps.__init__(self)  # self.step_cost: the measured steps' cost model, fed once a step
        self.preemption = PreemptionChooser(
            config, swap_cost if block_manager.num_host_blocks else None, cost=self.step_cost
        )

    @property
    def num_waiting(self) -> int:
        return len(self.policy)

    def has_unfinished(self) -> bool:
        return bool(self.running) or len(self.policy) > 0

    def has_room(self, waiting: list[Sequence]) -> bool:
        """Would one more request start at the next step, given the `waiting` sequences? True while
        running + waiting stay under max_num_seqs and the free blocks cover every waiting prompt
        plus the running ones' growth, so a worker can take a batch of requests at once without
        hoarding work that another worker could start sooner."""
        if len(self.running) + len(waiting) >= self.config.max_num_seqs:
            return False
        need = sum(self.block_manager.blocks_needed(s.num_tokens + 1) for s in waiting)
        return self.block_manager.num_free_blocks - need > self._reserve + len(self.running)

    def has_room_for(self, waiting: list[Sequence], priority: int = 0, tenant: str | None = None) -> bool:
        """has_room, or a request of `priority` (and `tenant`) would start at the next step by pushing
        out running work that the policy lets it displace (lower tiers; under VTC a tenant holding
        more than its share), counting the `waiting` sequences that would claim the same victims.
        So a worker keeps pulling urgent lanes while every slot or block is held by bulk work."""
        if self.has_room(waiting):
            return True
        return self.policy.displaceable(priority, tenant, self.running) > self.policy.ahead(
            priority, tenant, waiting
        )

    def room(self, waiting: list[Sequence], priorities: Iterable[int]) -> Room:
        """``has_room`` and ``has_room_for`` of each of ``priorities`` as counts (engine/scheduler/room.py):
        how many requests would start at the next step, given the ``waiting`` sequences."""
        slots = self.config.max_num_seqs - len(self.running) - len(waiting)
        need = sum(self.block_manager.blocks_needed(s.num_tokens + 1) for s in waiting)
        spare = self.block_manager.num_free_blocks - need - self._reserve - len(self.running)
        smallest = self.block_manager.blocks_needed(2)  # a one-token prompt and its first output
        free = max(0, min(slots, -(-spare // smallest)))  # has_room holds while spare stays above 0
        displacing, fresh, tenants = {}, {}, {}
        for p in priorities:
            displacing[p] = self._tenant_room(p, None, waiting)
            held = {s.tenant for s in (*self.running, *waiting) if s.priority == p or not self.policy.tiers}
            fresh[p], tenants[p] = (
                self._tenant_room(p, FRESH_TENANT, waiting),
                {t: self._tenant_room(p, t, waiting) for t in held},
            )
        return Room(
            free, displacing, bool(self.policy.tiers), fresh, tenants, self._prompt_tokens_left(waiting)
        )

    def _prompt_tokens_left(self, waiting: list[Sequence]) -> int | None:
        """The next step's token budget left for prompts not in the engine yet: what the running
        sequences (a decode: one token; a prompt: the rest of it) and the ``waiting`` prompts leave
        of max_num_batched_tokens (prefix-cache hits not counted). None (no bound) unless the policy
        is fair between tenants (VTC) and batching continuous: then the lanes' take weighs tenants
        against each other, which it can only do for what it has not handed to one engine yet.
        Without VTC the engine's queue orders a burst as the lane would, and an SLO-aware policy
        refuses on arrival what it sees cannot meet its target, so it sees every entry it has slots
        for."""
        if not self._bounded_take:
            return None
        busy = sum(max(1, s.num_tokens - s.num_computed_tokens) for s in self.running)
        busy += sum(s.num_tokens - s.num_computed_tokens for s in waiting)
        return self.config.max_num_batched_tokens - busy

    def _tenant_room(self, priority: int, tenant: str | None, waiting: list[Sequence]) -> int:
        """Requests of `priority` (of `tenant`, if given) that would start by displacing, beyond
        those of the `waiting` sequences that start before them (policy.ahead)."""
        return self.policy.displaceable(priority, tenant, self.running) - self.policy.ahead(
            priority, tenant, waiting
        )

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.policy.add(seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self.block_manager.begin_step()
        for seq, error in self.policy.begin_step(self.running):
            self.finish(seq)
            plan.refused.append((seq, error))
        self._evict_over_cap(plan)  # for urgent prompts that started inside the step before
        evicted = len(plan.preempted)
        if self.config.batching != "continuous" and not self.running:
            self._batch_left = self._next_batch()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.can_append(seq, n):
                victim = self.policy.victim(self.running[i:])
                self._preempt(victim, plan)
                if victim is seq:
                    break
            else:
                item = ScheduledSeq(seq, n)
                if self.drafter is not None and n == 1 and budget > 1 and item.samples:
                    draft = self.drafter.drafts(seq, budget - 1, len(self.running))
                    if draft and self.block_manager.can_append(seq, 1 + len(draft)):
                        item.draft = draft  # never preempts anyone: without room, a plain decode
                self.block_manager.append(seq, item.num_query_tokens)
                plan.scheduled.append(item)
                budget -= item.num_query_tokens
                i += 1
        cap = self._short_step_cap()
        self._urgent_starts, self._deferring, self._starts = set(), [], set()
        preempted = plan.preempted[evicted:]  # for blocks, in this step
        if not preempted or self._outranks(preempted):
            self._admit(plan, budget, cap)
        if self.config.isolate_urgent_prefill:
            self._isolate_urgent(plan, cap)
        self._deferred = {id(s) for s in self._deferring}
        if cap is not None:
            self._shorten(plan, cap)
        for item in plan.scheduled:
            self.policy.on_scheduled(item.seq, item.num_tokens)
        return plan

    def complete_drafts(self, plan: StepPlan) -> None:
        """Before the plan's forward: the drafts that waited for their KV slots (Drafter.complete)."""
        if self.drafter is not None:
            self.drafter.complete(plan)

    def _outranks(self, preempted: list[Sequence]) -> bool:
        """Is the waiting head of a higher tier than everything this step preempted for blocks? Then
        it is still admitted (and may displace): lower tiers' block pressure never holds it back."""
        head = self.policy.peek()
        return (
            self.policy.tiers
            and head is not None
            and head not in preempted
            and head.priority > max(q.priority for q in preempted)
        )

    def _next_batch(self) -> int:
        """static/dynamic, with the engine empty: how many waiting sequences the next batch takes
        (0: none yet; dynamic waits until the batch is full or its head has waited batch_wait_s)."""
        waiting, size = len(self.policy), self.config.max_num_seqs
        head = self.policy.peek()
        if head is None:
            return 0
        if (
            self.config.batching == "dynamic"
            and waiting < size
            and self._clock() - head.arrival_time < self.config.batch_wait_s
        ):
            return 0
        return min(size, waiting)

    def _admit(self, plan: StepPlan, budget: int, cap: int | None = None) -> None:
        while True:
            if self.config.batching != "continuous" and self._batch_left <= 0:
                return  # static/dynamic: only the current batch's members start
            seq = self.policy.peek()
            if seq is None or seq in plan.preempted or not self.policy.may_admit(seq, self.running, plan):
                return  # (one preempted by this admission loop does not come back in the same step)
            if cap is not None and plan.num_tokens >= cap and not self.policy.urgent(seq):
                return  # a short step (_shorten): no more bulk work starts in it
            if self.admit_check is not None and not self.admit_check(seq, self.running):
                return
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                regained = self._make_room(seq, plan, for_budget=budget <= 0)
                if regained < 0:
                    return
                budget += regained
                continue
            hits = self.block_manager.prefix_hits(seq)
            remaining = seq.num_tokens - self.block_manager.num_restored_tokens(seq, hits)
            if remaining > budget and self.config.isolate_urgent_prefill and self.policy.urgent(seq):
                budget += self._clear_for_urgent(seq, plan, cap)  # what isolation would defer anyway
            if remaining > budget:  # rather than split its prompt, the head may defer lower chunks
                regained = self._make_room(seq, plan, for_budget=True)
                if regained >= 0:
                    budget += regained
                    continue
            if remaining > budget and not self.config.chunked_prefill:
                return
            if remaining > budget and self._urgent_prefills(plan, cap) and self.policy.urgent(seq):
                return  # starts whole next step; the tokens it cleared shorten this urgent step
            n = min(remaining, budget)
            reserve = self._reserve if self.running else 0  # an idle engine always starts the head
            if not self.block_manager.can_allocate(seq, hits, n, reserve=reserve):
                regained = self._make_room(seq, plan, for_budget=False)
                if regained < 0:
                    return
                budget += regained
                continue
            if cap is not None and self.policy.urgent(seq):
                self._urgent_starts.add(id(seq))
            self._starts.add(id(seq))
            self.policy.pop()
            swapped = self.block_manager.is_swapped(seq)
            self.num_admissions += 1
            self._batch_left -= 1
            plan.swap_in += self.block_manager.allocate(seq, hits, n)  # copies back a swapped-out sequence
            if seq.num_preemptions:
                seq.record(
                    "resumed", mode="swap" if swapped else "recompute", cached_tokens=seq.num_cached_tokens
                )
            else:
                seq.record("admitted", cached_tokens=seq.num_cached_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            plan.scheduled.append(ScheduledSeq(seq, n))
            budget -= n

    def _make_room(self, seq: Sequence, plan: StepPlan, for_budget: bool) -> int:
        """Let the policy push a running sequence out for the waiting head `seq`. For the token
        budget the victim's tokens of this step are deferred (it keeps its blocks and its place);
        for the sequence cap or KV blocks it is preempted.
        Returns the budget given back, or -1 when the policy chose nobody."""
        chunks = {id(it.seq): it for it in plan.scheduled}
        if for_budget:  # not one admitted in this step either: two tenants never trade places
            candidates = [q for q in self.running if id(q) in chunks and id(q) not in self._starts]
        else:  # not one admitted in this step: no thrashing
            admitted = {
                id(it.seq) for it in plan.scheduled if it.seq.num_computed_tokens == it.seq.num_cached_tokens
            }
            candidates = [q for q in self.running if id(q) not in admitted or id(q) not in chunks]
        victim = self.policy.displace(seq, candidates, for_budget=for_budget, plan=plan)
        if victim is None:
            return -1
        item = chunks.get(id(victim))
        if item is not None:
            plan.scheduled.remove(item)
            if item.draft and for_budget:  # deferred: its drafts' slots go back (it keeps its place)
                self.block_manager.trim(victim)
        if not for_budget:
            self._preempt(victim, plan)
        return item.num_query_tokens if item is not None else 0

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        """Preempt by swap (its computed blocks copied to host memory; back on readmission) when
        the preemption mode and the estimated costs say so, else by recompute (its blocks freed).
        Either way the sequence keeps its tokens and its place."""
        self.running.remove(seq)
        computed = seq.num_computed_tokens
        if self.preemption.use_swap(seq, self.block_manager):
            plan.swap_out += self.block_manager.swap_out(seq)
            self.num_swaps += 1
            seq.record("preempted", mode="swap", computed_tokens=computed)
        else:
            self.block_manager.free(seq)
            seq.record("preempted", mode="recompute", computed_tokens=computed)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self._batch_left += 1  # static/dynamic: still a member of the batch, to be readmitted
        self.policy.add_preempted(seq)
        plan.preempted.append(seq)

    def finish_step(self, plan: StepPlan) -> None:
        """The forward ran: advance every scheduled sequence and register its filled blocks."""
        for item in plan.scheduled:
            item.seq.num_computed_tokens += item.num_tokens
            self.block_manager.commit(item.seq)

    def finish(self, seq: Sequence) -> None:
        """seq is done (stopped or aborted): drop it from the running set or the queue, free blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.policy.remove(seq)
            self.block_manager.free(seq)  # a swapped-out sequence holds host blocks
        if seq.status is not SequenceStatus.FINISHED:
            self.policy.on_finished(seq)
        seq.status = SequenceStatus.FINISHED

    def observe_step(self, plan: StepPlan, seconds: float) -> None:
        """The engine measured the step of `plan`: the policy's step-cost model (SLO) and the one the
        preemption chooser and the short steps beside urgent work read."""
        if not self.observing:  # engine/calibrate.py's warm-up round
            return
        self.policy.observe(plan, seconds)
        self.step_cost.observe(*split(plan), seconds)

    def predict_ttft(self, num_prompt_tokens: int, priority: int = 0) -> float | None:
        """Predicted seconds to the first token of a request arriving now, or None when the policy
        keeps no step-cost model (only SLO-aware policies do). For the gateway's door check."""
        return self.policy.predict_ttft(num_prompt_tokens, priority, self.running)

    def slo_load(self) -> SLOLoad | None:
        """The SLO policy's prediction inputs, or None for policies without one."""
        return self.policy.load(self.running)
