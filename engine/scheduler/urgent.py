"""Steps beside urgent work (SchedulerConfig.isolate_urgent_prefill, urgent_prefill_defers_decodes,
urgent_step_overhead): the Scheduler's part that keeps an urgent request's first token from
waiting behind bulk work. An urgent prefill's step runs no other prefill chunk (and, while steps
are kept short, none of the decodes the policy says it goes before); a second urgent prompt that
would be split starts next step instead; a step that prefills no urgent work is cut to a token cap
from the fitted step-cost model, also for urgent_horizon_s after urgent work was last present.
docs/scheduling.md ("Short steps beside urgent work").
"""

from __future__ import annotations

from collections.abc import Callable

from engine.config import SchedulerConfig
from engine.kv_groups import Blocks
from engine.request import Sequence, SequenceStatus
from engine.scheduler.cost_model import StepCostModel
from engine.scheduler.plan import ScheduledSeq, StepPlan
from engine.scheduler.policy import SchedulingPolicy


class UrgentSteps:
    """Mixed into Scheduler: reads its config, policy and running list."""

    config: SchedulerConfig
    policy: SchedulingPolicy
    running: list[Sequence]
    block_manager: Blocks
    num_admissions: int
    _reserve: int
    _clock: Callable[[], float]
    _preempt: Callable[[Sequence, StepPlan], None]

    def __init__(self) -> None:
        self._urgent_starts: set[int] = set()  # ids of sequences admitted in this step as urgent
        self._deferring: list[Sequence] = []  # decodes an urgent prefill keeps out of this step
        self._deferred: set[int] = set()  # ids of those of the step before
        self._urgent_seen: float | None = None  # clock when urgent work was last present
        # running sequences that urgent prompts started over the sequence cap in a step in flight
        # displace: preempted at the next step's start (_evict_over_cap)
        self._evict_next: list[Sequence] = []
        # measured steps' cost, for the short steps beside urgent work (_short_step_cap)
        self.step_cost = StepCostModel(
            self.config.cost_step_s, self.config.cost_prefill_token_s, self.config.cost_decode_seq_s
        )

    def _urgent_prefills(self, plan: StepPlan, cap: int | None) -> bool:
        """While steps are kept short (`cap`, with isolate_urgent_prefill): does the step so far
        prefill an urgent request? Then a second urgent prompt that would be split starts whole in
        the next step (its first token needs all of it), and its chunk does not hold back the first
        one's. Where a step costs about the same whatever its tokens (no cap) splitting is cheaper
        than waiting a step, and a light tenant's prompt waiting would widen VTC's gap."""
        if cap is None or not self.config.isolate_urgent_prefill:
            return False
        return any(not it.is_decode and self.policy.urgent(it.seq) for it in plan.scheduled)

    def _clear_for_urgent(self, seq: Sequence, plan: StepPlan, cap: int | None) -> int:
        """The urgent head `seq` would have to split its prompt: take the step's tokens of the other
        prefill chunks (and of the decodes it defers) now, not after its prompt was cut short."""
        out = [it for it in plan.scheduled if not it.is_decode and not self.policy.urgent(it.seq)]
        out += self._deferrable(seq, plan, cap, over=True)
        for it in out:
            plan.scheduled.remove(it)
        return sum(it.num_tokens for it in out)

    def _isolate_urgent(self, plan: StepPlan, cap: int | None) -> None:
        """If an urgent request prefills in this step, other prefill chunks wait a step (they keep
        their blocks): the step is its prompt plus the decodes, not a full budget of others' chunks."""
        prefills = [it for it in plan.scheduled if not it.is_decode]
        urgent = [it for it in prefills if self.policy.urgent(it.seq)]
        if urgent and len(urgent) < len(prefills):
            keep = {id(it) for it in urgent}
            plan.scheduled = [it for it in plan.scheduled if id(it) in keep or it.is_decode]
        if urgent:  # the decodes that the urgent prompts go before wait this step as well
            out = {id(it) for u in urgent for it in self._deferrable(u.seq, plan, cap)}
            plan.scheduled = [it for it in plan.scheduled if id(it) not in out]

    def _deferrable(
        self, seq: Sequence, plan: StepPlan, cap: int | None, over: bool = False
    ) -> list[ScheduledSeq]:
        """The decodes of `plan` that the urgent prefill of `seq` keeps out of its step
        (config.urgent_prefill_defers_decodes, policy.defers): only while steps are kept short and
        the step is over their `cap` (not where a step costs about the same whatever its tokens),
        never one deferred in the step before (a decode loses at most one step in two)."""
        if not self.config.urgent_prefill_defers_decodes or cap is None:
            return []
        if not over and plan.num_tokens <= cap:
            return []
        out = [
            it
            for it in plan.scheduled
            if it.is_decode and id(it.seq) not in self._deferred and self.policy.defers(seq, it.seq)
        ]
        self._deferring += [it.seq for it in out]
        return out

    def _short_step_cap(self) -> int | None:
        """The step's token cap while urgent work is running or waiting, and for
        config.urgent_horizon_s after it last was (so the first urgent arrival of a quiet spell
        meets a short step too), or None (the full budget): the tokens at which the fitted fixed
        cost of a step is config.urgent_step_overhead of its time, at least a quarter of the budget."""
        share, budget = self.config.urgent_step_overhead, self.config.max_num_batched_tokens
        if not share:
            return None
        now = self._clock()
        if self.policy.urgent_present(self.running):
            self._urgent_seen = now
        elif self._urgent_seen is None or now - self._urgent_seen > self.config.urgent_horizon_s:
            return None
        step_s, token_s = self.step_cost.theta[0], self.step_cost.theta[1] or self.step_cost.prior[1]
        cap = max(budget // 4, int(step_s * (1 - share) / (share * token_s)))
        return cap if cap < budget else None

    def _shorten(self, plan: StepPlan, cap: int) -> None:
        """Urgent work is running or waiting and this step prefills none of it: cut other prefill
        chunks (in policy.cut_order: lowest tier, most-served tenant first) until the step is at
        most `cap` tokens (decodes always run). A cut chunk keeps its blocks and its place and goes
        on next step; so the step, and the wait of an urgent request arriving during it, is shorter."""
        chunks = [it for it in plan.scheduled if not it.is_decode and not it.draft]
        if any(id(it.seq) in self._urgent_starts or self.policy.urgent(it.seq) for it in chunks):
            return  # its own step: isolation (_isolate_urgent) already keeps it to its prompt
        excess = plan.num_tokens - cap
        for it in sorted(chunks, key=lambda it: self.policy.cut_order(it.seq)):
            if excess <= 0:
                return
            cut = min(excess, it.num_tokens)
            excess -= cut
            if cut == it.num_tokens:
                plan.scheduled.remove(it)
            else:
                it.num_tokens -= cut

    def schedule_interrupt(self) -> StepPlan:
        """Mid-step (engine/interrupts.py, between two layers of a step in flight): a plan of the
        urgent prompts at the head of the queue that start whole, now, beside the step in flight,
        or an empty one. Nothing running is touched now (the step in flight holds its sequences and
        their blocks): no chunk, no swap-in; a fresh prompt only, without a grammar, an adapter or
        further choices, and only with blocks to spare above the reserve. At the sequence cap it
        starts over the cap for a running sequence that the policy would push out for it (a lower
        tier; under VTC one a tenant holds beyond its share), which is preempted at the next step's
        start (_evict_over_cap), as the step boundary would have done before admitting it; so an
        urgent prompt does not wait for the step in flight while bulk work holds every slot. What it
        starts runs as any admitted sequence from the next step on."""
        plan = StepPlan()
        budget = self.config.max_num_batched_tokens
        while True:
            seq = self.policy.peek()
            if seq is None or seq.num_preemptions or seq.num_computed_tokens or not self.policy.urgent(seq):
                break
            if seq.params.structured is not None or seq.lora is not None or seq.params.n > 1:
                break
            if not self.policy.may_admit(seq, self.running, plan):
                break
            hits = self.block_manager.prefix_hits(seq)
            n = seq.num_tokens - self.block_manager.num_restored_tokens(seq, hits)
            if n > budget or not self.block_manager.can_allocate(seq, hits, n, reserve=self._reserve):
                break
            if len(self.running) - len(self._evict_next) >= self.config.max_num_seqs:
                started = {id(it.seq) for it in plan.scheduled}
                candidates = [
                    q
                    for q in self.running
                    if id(q) not in started and all(q is not v for v in self._evict_next)
                ]
                victim = self.policy.displace(seq, candidates)
                if victim is None:
                    break
                self._evict_next.append(victim)
            self.policy.pop()
            self.num_admissions += 1
            self.block_manager.allocate(seq, hits, n)
            seq.record("admitted", cached_tokens=seq.num_cached_tokens, interrupting=True)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            plan.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        for item in plan.scheduled:
            self.policy.on_scheduled(item.seq, item.num_tokens)
        return plan

    def _evict_over_cap(self, plan: StepPlan) -> None:
        """At a step's start: preempt the sequences that urgent prompts started in the step before
        displaced (schedule_interrupt), while the running ones are over the sequence cap (one that
        finished meanwhile freed its slot itself)."""
        victims, self._evict_next = self._evict_next, []
        for victim in victims:
            if len(self.running) <= self.config.max_num_seqs:
                return
            if any(q is victim for q in self.running):
                self._preempt(victim, plan)
