"""The SLO load snapshot and the one time-to-first-token formula, shared by engine and gateway.

An SLO-aware policy (slo.py) describes what it predicts from as an ``SLOLoad`` of plain numbers;
``predict_ttft`` turns it into seconds. The engine calls it at a request's arrival; a gateway calls
it on the loads its workers publish, to refuse at the door. Both run this code, so they agree:

    work  = W + Q + P
    TTFT  = waited + ceil(work / (B - D)) * (step + prefill_token * min(work, B - D) + decode_seq * D)
            + slot_wait

with W the prompt tokens still to compute of the requests waiting ahead (of the request's priority
or above when the policy has tiers, else all), Q prompt tokens queued in front of the engine (the
gateway's estimate of unread lane entries; 0 inside the engine), P the request's own prompt, B the
step's token budget, D the running sequences (each decodes every step) and slot_wait, at the
sequence cap, the time until the nearest running request ends. Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SLOLoad:
    """What ``predict_ttft`` reads, as plain numbers (published by workers, read by gateways)."""

    step_s: float  # the fitted step-cost model: seconds per step,
    prefill_token_s: float  # per prefill token,
    decode_seq_s: float  # and per decoding sequence
    max_num_batched_tokens: int
    max_num_seqs: int
    running: int  # sequences decoding every step (D)
    slot_wait_s: float  # at the sequence cap: decode steps until the nearest running request ends; else 0
    waiting_tokens: dict[int, int] = field(default_factory=dict)  # priority -> prompt tokens to compute
    tiered: bool = False  # True: only waiting work of a request's priority or above is ahead of it

    def step_cost(self, prefill_tokens: float, decode_seqs: int) -> float:
        """Seconds of one step with this many prefill tokens and decoding sequences."""
        return self.step_s + self.prefill_token_s * prefill_tokens + self.decode_seq_s * decode_seqs


def predict_ttft(
    load: SLOLoad, prompt_tokens: int, priority: int = 0, *, queued_tokens: float = 0.0, waited: float = 0.0
) -> float:
    """Seconds to the first token of a request of ``priority`` with ``prompt_tokens`` to compute,
    arriving now behind ``queued_tokens`` more prompt tokens, having already waited ``waited``."""
    ahead = sum(t for p, t in load.waiting_tokens.items() if not load.tiered or p >= priority)
    work = ahead + queued_tokens + prompt_tokens
    decodes = load.running
    per_step = max(1, load.max_num_batched_tokens - decodes)
    steps = math.ceil(work / per_step)
    return waited + steps * load.step_cost(min(work, per_step), decodes) + load.slot_wait_s
