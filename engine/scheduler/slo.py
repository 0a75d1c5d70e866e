"""SLO-aware admission: refuse (or demote) what cannot meet its TTFT target; keep running TPOT.

Wraps any ordering policy ("slo", "priority+slo", "priority+vtc+slo"). A request's targets are its
own (`Sequence.ttft_target_s` / `tpot_target_s`, set by the gateway from the tenant) or else its
tier's (`config.tier_ttft_targets` / `tier_tpot_targets`). From the step-cost model (fed with
measured step times through `observe`) it predicts a request's time to first token:

    steps = ceil(W / (B - D)),   TTFT = waited + steps * cost(min(W, B - D) prefill tokens, D decodes)

with B the step's token budget, D the running sequences (they decode every step) and W the prompt
tokens still to compute of every waiting request of its tier or above, plus its own (plus, at the
sequence cap, the decode steps until the nearest running request ends). At arrival a request
predicted to miss its target raises `SLOUnattainableError` (no slot is taken; retry_after is the
predicted excess); a waiting request whose wait plus its own prefill already passes the target is
refused at the start of a step (the engine reports it finished with reason "slo_unattainable").
With `config.slo_demote` such requests move one tier down instead and run best-effort (no TTFT
target). A request is not admitted while the steady decode step with one more sequence would be
slower than the tightest TPOT target of the running ones (unless nothing runs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator

from engine.config import SchedulerConfig
from engine.errors import SLOUnattainableError
from engine.request import Sequence
from engine.scheduler.cost_model import StepCostModel, split
from engine.scheduler.load import SLOLoad
from engine.scheduler.plan import StepPlan
from engine.scheduler.policy import FCFSPolicy, SchedulingPolicy


class SLOPolicy(SchedulingPolicy):
    """SLO-aware admission around `inner` (default FCFS), which keeps the queue and its order."""

    name = "slo"
    wraps = True

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        inner: SchedulingPolicy | None = None,
    ) -> None:
        super().__init__(config, clock=clock, inner=inner)
        self.inner = inner if inner is not None else FCFSPolicy(self.config)  # (an empty queue is falsy)
        self.cost = StepCostModel(
            self.config.cost_step_s, self.config.cost_prefill_token_s, self.config.cost_decode_seq_s
        )
        self._best_effort: set[str] = set()  # demoted request ids: no TTFT target any more
        self._running: list[Sequence] = []  # the scheduler's running list, seen at begin_step

    # ---- targets and prediction ------------------------------------------------------------
    def ttft_target(self, seq: Sequence) -> float | None:
        if seq.request_id in self._best_effort:
            return None
        return seq.ttft_target_s or self.config.tier_ttft_targets.get(seq.priority)

    def tpot_target(self, seq: Sequence) -> float | None:
        return seq.tpot_target_s or self.config.tier_tpot_targets.get(seq.priority)

    @property
    def tiers(self) -> bool:  # type: ignore[override]  # the wrapped policy's class attribute
        return self.inner.tiers

    def _slot_wait(self, running: Collection[Sequence]) -> float:
        """At the sequence cap, a new request waits for a slot: the nearest end among running."""
        if not running or len(running) < self.config.max_num_seqs:
            return 0.0
        left = min(s.params.max_tokens - s.num_output_tokens for s in running)
        return max(0, left) * self.cost.predict(0, len(running))

    def load(self, running: Collection[Sequence] = ()) -> SLOLoad:
        """The inputs of predict_ttft right now (see SLOLoad)."""
        waiting: dict[int, int] = {}
        for s in self.inner.waiting():
            waiting[s.priority] = waiting.get(s.priority, 0) + s.num_tokens - s.num_computed_tokens
        step_s, prefill_token_s, decode_seq_s = self.cost.theta
        return SLOLoad(
            step_s=step_s,
            prefill_token_s=prefill_token_s,
            decode_seq_s=decode_seq_s,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_num_seqs=self.config.max_num_seqs,
            running=len(running),
            slot_wait_s=self._slot_wait(running),
            waiting_tokens=waiting,
            tiered=self.tiers,
        )

    def _refusal(self, seq: Sequence, predicted: float, target: float) -> SLOUnattainableError:
        return SLOUnattainableError(
            f"request {seq.request_id!r} cannot meet its time-to-first-token target of {target:.3g} s "
            f"(predicted {predicted:.3g} s with the work ahead of it); retry later",
            retry_after=max(1.0, math.ceil(predicted - target)),
            predicted_ttft_s=predicted,
            param="ttft_target",
        )

    def _demote(self, seq: Sequence) -> None:
        seq.priority -= 1
        self._best_effort.add(seq.request_id)

    # ---- queue: delegated ------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        target = self.ttft_target(seq)
        if target is not None:
            pred = self.predict_ttft(
                seq.num_tokens, seq.priority, self._running, self.clock() - seq.arrival_time
            )
            if pred is not None and pred > target:
                if not self.config.slo_demote:
                    raise self._refusal(seq, pred, target)
                self._demote(seq)
        self.inner.add(seq)

    def add_preempted(self, seq: Sequence) -> None:
        self.inner.add_preempted(seq)

    def peek(self) -> Sequence | None:
        return self.inner.peek()

    def pop(self) -> Sequence:
        return self.inner.pop()

    def remove(self, seq: Sequence) -> bool:
        return self.inner.remove(seq)

    def waiting(self) -> Iterator[Sequence]:
        return self.inner.waiting()

    def __len__(self) -> int:
        return len(self.inner)

    def victim(self, running: list[Sequence]) -> Sequence:
        return self.inner.victim(running)

    def displace(
        self,
        seq: Sequence,
        candidates: list[Sequence],
        *,
        for_budget: bool = False,
        plan: StepPlan | None = None,
    ) -> Sequence | None:
        return self.inner.displace(seq, candidates, for_budget=for_budget, plan=plan)

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        self.inner.on_scheduled(seq, num_tokens)

    def displaceable(self, priority: int, tenant: str | None, running: list[Sequence]) -> int:
        return self.inner.displaceable(priority, tenant, running)

    def ahead(self, priority: int, tenant: str | None, waiting: list[Sequence]) -> int:
        return self.inner.ahead(priority, tenant, waiting)

    def defers(self, seq: Sequence, other: Sequence) -> bool:
        return self.inner.defers(seq, other)

    def urgent(self, seq: Sequence) -> bool:
        return self.inner.urgent(seq)

    def urgent_present(self, running: list[Sequence]) -> bool:
        return self.inner.urgent_present(running)

    def cut_order(self, seq: Sequence) -> tuple:
        return self.inner.cut_order(seq)

    def on_finished(self, seq: Sequence) -> None:
        self._best_effort.discard(seq.request_id)
        self.inner.on_finished(seq)

    # ---- the SLO decisions -----------------------------------------------------------------
    def begin_step(self, running: list[Sequence]) -> list[tuple[Sequence, Exception]]:
        self._running = running
        refused = list(self.inner.begin_step(running))
        now, decodes = self.clock(), len(running)
        per_step = max(1, self.config.max_num_batched_tokens - decodes)
        for seq in list(self.inner.waiting()):
            target = self.ttft_target(seq)
            if target is None or seq.first_token_time is not None or seq.num_preemptions:
                continue
            left = seq.num_tokens - seq.num_computed_tokens
            own = math.ceil(left / per_step) * self.cost.predict(min(left, per_step), decodes)
            if now - seq.arrival_time + own > target:
                if self.config.slo_demote:
                    self.inner.remove(seq)
                    self._demote(seq)
                    self.inner.add_preempted(seq)
                else:
                    refused.append((seq, self._refusal(seq, now - seq.arrival_time + own, target)))
        return refused

    def may_admit(self, seq: Sequence, running: list[Sequence], plan: StepPlan) -> bool:
        if not self.inner.may_admit(seq, running, plan):
            return False
        targets = [t for t in (self.tpot_target(s) for s in running + [seq]) if t is not None]
        return not running or not targets or self.cost.predict(0, len(running) + 1) <= min(targets)

    def observe(self, plan: StepPlan, seconds: float) -> None:
        prefill, decodes = split(plan)
        self.cost.observe(prefill, decodes, seconds)
        self.inner.observe(plan, seconds)
