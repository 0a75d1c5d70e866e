"""Counters an engine keeps about its own work (read by benchmarks, tests and metrics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    steps: int = 0
    prefill_tokens: int = 0  # prompt (or recomputed) tokens run through the model
    decode_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0  # by recompute or by swap
    swaps: int = 0  # preemptions by swap
    swapped_blocks: int = 0  # KV blocks copied to host memory and back
    swap_seconds: float = 0.0  # spent in those copies (on a GPU: launching them)
    utilization_sum: float = 0.0  # sum over steps of real tokens / allocated slots
    utilization_steps: int = 0
    forward_seconds: float = 0.0
    lora_slot_loads: int = 0  # adapters copied from host memory into a device slot
    lora_slot_evictions: int = 0  # resident adapters replaced to make room for another
    admissions: int = (
        0  # sequences admitted into the running batch, readmissions included (preemptions / this:
    )
    #                      the preemption rate, the share of admissions that ended in a preemption)
    prefix_hit_tokens: int = 0  # prompt tokens taken from the prefix cache instead of computed
    slo_refusals: int = 0  # requests refused for their TTFT target (on arrival or at a step start)
    # The last step that ran the model: its batch (sequences), its tokens and its forward's seconds.
    last_step_seqs: int = 0
    last_step_tokens: int = 0
    last_step_seconds: float = 0.0

    @property
    def recompute_preemptions(self) -> int:
        return self.preemptions - self.swaps

    @property
    def kv_utilization(self) -> float:
        """Mean over steps of the fraction of allocated KV slots that hold real tokens."""
        return self.utilization_sum / self.utilization_steps if self.utilization_steps else 1.0
