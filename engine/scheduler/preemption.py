"""How a running sequence is preempted: by recompute or by swap, chosen by estimated cost.

recompute: its KV blocks are freed; on readmission its tokens run through the model again (the
leading blocks still in the prefix cache are skipped). swap: the blocks of its computed tokens are
copied to host memory and freed; on readmission they are copied back into fresh blocks and it
continues where it stopped. `SchedulerConfig.preemption_mode` says which: "recompute", "swap"
(whenever the swap space holds the victim) or "auto", per victim the cheaper of

    recompute_s = computed tokens * prefill_token_s            (StepCostModel, fitted on measured steps;
                                                                the configured prior while the fit is 0)
    swap_s      = fixed_s + blocks * block_s                   (out and back in; measured by the runner)

Either way a victim that does not fit the free host blocks is recomputed. Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import SchedulerConfig
from engine.kv_groups import Blocks
from engine.request import Sequence
from engine.scheduler.cost_model import StepCostModel


@dataclass(frozen=True)
class SwapCost:
    """Seconds to copy a victim's blocks to host memory and back: fixed_s + blocks * block_s."""

    fixed_s: float  # per swap-out + swap-in, whatever the size (op launches, per-layer loops)
    block_s: float  # per KV block (every layer's K and V), out and back in


class PreemptionChooser:
    def __init__(
        self, config: SchedulerConfig, swap_cost: SwapCost | None = None, cost: StepCostModel | None = None
    ):
        """`cost`: the measured steps' cost model, fed by its owner (the Scheduler's, whatever the
        policy); only "auto" with a measured copy weighs costs."""
        self.mode = config.preemption_mode
        self.swap_cost = swap_cost
        self.cost = cost if self.mode == "auto" and swap_cost else None

    def estimate(self, seq: Sequence, block_manager: Blocks) -> tuple[float, float]:
        """(recompute seconds, swap seconds) for preempting seq now; swap is inf when unmeasured."""
        per_token = 0.0
        if self.cost is not None:  # a fit of noisy steps can flatten to 0: no prefill is free, keep the prior
            per_token = self.cost.theta[1] or self.cost.prior[1]
        recompute = seq.num_computed_tokens * per_token
        if self.swap_cost is None:
            return recompute, float("inf")
        return recompute, self.swap_cost.fixed_s + block_manager.blocks_needed(
            seq.num_computed_tokens
        ) * self.swap_cost.block_s

    def use_swap(self, seq: Sequence, block_manager: Blocks) -> bool:
        """Preempt seq by swap (else by recompute)?"""
        if self.mode == "recompute" or not block_manager.can_swap_out(seq):
            return False
        if self.mode == "swap":
            return True
        recompute, swap = self.estimate(seq, block_manager)
        return swap < recompute
