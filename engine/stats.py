"""Counters an engine keeps about its own work (read by benchmarks, tests and metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.kv_groups import Blocks
    from engine.lora.manager import LoRAManager
    from engine.output import Sampled
    from engine.scheduler import Scheduler, StepPlan


@dataclass
class StepRun:
    """What running one plan gave."""

    sampled: Sequence[Sampled]  # ModelRunner.run's (item, token, logprob) per sampling item
    seconds: float  # the forward and the sampling
    decode_tokens: int  # items that decoded an output token (every other computed token: prefill)
    experts_touched: int = 0  # distinct experts the forward ran, summed over its MoE layers
    weight_bytes: int = 0  # bytes of weights the forward read: dense ones and the experts it ran


# The mean KV utilization walks every block the running sequences hold (about 0.4 us a block on
# the host: 128 sequences of 4,096 tokens, 13 ms a step), so it samples one step in every
# ceil(blocks held / UTILIZATION_BLOCKS): a step spends a few tens of microseconds on it on average.
UTILIZATION_BLOCKS = 256


@dataclass
class EngineStats:
    steps: int = 0
    prefill_tokens: int = 0  # prompt (or recomputed) tokens run through the model
    decode_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0  # by recompute or by swap
    interrupts: int = 0  # urgent prompts' steps run inside a step in flight (engine/interrupts.py)
    swaps: int = 0  # preemptions by swap
    swapped_blocks: int = 0  # KV blocks copied to host memory and back
    swap_seconds: float = 0.0  # spent in those copies (on a GPU: launching them)
    utilization_sum: float = 0.0  # sum over steps of real tokens / allocated slots
    utilization_steps: int = 0  # steps sampled for it (UTILIZATION_BLOCKS)
    _utilization_countdown: int = field(default=0, repr=False)
    forward_seconds: float = 0.0
    lora_slot_loads: int = 0  # adapters copied from host memory into a device slot
    lora_slot_evictions: int = 0  # resident adapters replaced to make room for another
    # sequences admitted into the running batch, readmissions included (preemptions / this: the
    # preemption rate, the share of admissions that ended in a preemption)
    admissions: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens taken from the prefix cache instead of computed
    # Speculative decoding: drafts verified, drafts kept (acceptance rate: the ratio), verifications
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verifications: int = 0  # speculating sequences verified, summed over steps
    # the same three by the sequences' priority (the gateway's tier: gateway/lanes/keys.py)
    spec_draft_tokens_by_priority: dict[int, int] = field(default_factory=dict)
    spec_accepted_tokens_by_priority: dict[int, int] = field(default_factory=dict)
    spec_verifications_by_priority: dict[int, int] = field(default_factory=dict)
    spec_draft_lengths: dict[int, int] = field(default_factory=dict)  # verifications by drafts verified
    last_step_spec_seqs: int = 0  # speculating sequences the last step verified
    last_step_spec_draft_tokens: int = 0
    last_step_spec_accepted_tokens: int = 0
    slo_refusals: int = 0  # requests refused for their TTFT target (on arrival or at a step start)
    # The last step that ran the model: its batch (sequences), its tokens and its forward's seconds.
    last_step_seqs: int = 0
    last_step_tokens: int = 0
    last_step_seconds: float = 0.0
    # Mixtures of experts: distinct experts run per MoE layer, summed over layers and steps; bytes of
    # weights read (every dense weight each step, each expert once a step it runs in)
    experts_touched: int = 0
    weight_bytes_read: int = 0
    last_step_experts_touched: int = 0
    last_step_weight_bytes: int = 0

    @property
    def spec_acceptance_rate(self) -> float:
        """Share of verified draft tokens kept (0 when nothing was drafted)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    def record_verification(self, priority: int, drafted: int, accepted: int) -> None:
        """Count one speculating sequence's verified drafts (speculative.verify.settle, which zeroes
        the last step's totals first)."""
        self.spec_draft_tokens += drafted
        self.spec_accepted_tokens += accepted
        self.spec_verifications += 1
        self.last_step_spec_seqs += 1
        self.last_step_spec_draft_tokens += drafted
        self.last_step_spec_accepted_tokens += accepted
        self.spec_draft_lengths[drafted] = self.spec_draft_lengths.get(drafted, 0) + 1
        for counts, n in (
            (self.spec_draft_tokens_by_priority, drafted),
            (self.spec_accepted_tokens_by_priority, accepted),
            (self.spec_verifications_by_priority, 1),
        ):
            counts[priority] = counts.get(priority, 0) + n

    @property
    def recompute_preemptions(self) -> int:
        return self.preemptions - self.swaps

    @property
    def kv_utilization(self) -> float:
        """Mean over steps of the fraction of allocated KV slots that hold real tokens."""
        return self.utilization_sum / self.utilization_steps if self.utilization_steps else 1.0

    def record_step(
        self,
        plan: StepPlan,
        ran: StepRun | None,
        *,
        swap_seconds: float,
        scheduler: Scheduler,
        block_manager: Blocks,
        lora: LoRAManager | None,
    ) -> None:
        """Count one step, after the scheduler advanced what it ran. `ran`: None when the plan ran
        nothing (its preemptions, swaps and refusals still count)."""
        self.preemptions += len(plan.preempted)
        self.slo_refusals += len(plan.refused)
        if lora is not None:
            self.lora_slot_loads = lora.slots.loads
            self.lora_slot_evictions = lora.slots.evictions
        if plan.swap_out or plan.swap_in:
            self.swap_seconds += swap_seconds
            self.swaps += sum(block_manager.is_swapped(s) for s in plan.preempted)
            self.swapped_blocks += len(plan.swap_out) + len(plan.swap_in)
        if ran is None:
            return
        self.steps += 1
        self.forward_seconds += ran.seconds
        self.decode_tokens += ran.decode_tokens
        drafts = sum(len(item.draft) for item in plan.scheduled)
        self.prefill_tokens += plan.num_tokens - ran.decode_tokens - drafts
        self.output_tokens += sum(1 for item, _, _ in ran.sampled if item.seq.params.max_tokens)
        self.admissions = scheduler.num_admissions
        self.prefix_hit_tokens = block_manager.num_prefix_hit_tokens
        self.last_step_seqs, self.last_step_tokens = len(plan.scheduled), plan.num_tokens
        self.last_step_seconds = ran.seconds
        self.last_step_experts_touched, self.last_step_weight_bytes = ran.experts_touched, ran.weight_bytes
        self.experts_touched += ran.experts_touched
        self.weight_bytes_read += ran.weight_bytes
        self._utilization_countdown -= 1
        if self._utilization_countdown <= 0:  # a sampled step: the walk over every running block
            running = scheduler.running
            held = sum(s.num_computed_tokens for s in running) // block_manager.block_size + len(running)
            self._utilization_countdown = 1 + held // UTILIZATION_BLOCKS
            self.utilization_sum += block_manager.utilization(running)
            self.utilization_steps += 1
