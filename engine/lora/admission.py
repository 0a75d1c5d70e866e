"""The scheduler's LoRA admission check (plain Python, no torch).

A sequence may start only if its adapter can be in a device slot for every step it runs: the
adapters of the running sequences plus its own must fit `max_loras` slots. The scheduler asks
this of the head of its queue (engine/scheduler/scheduler.py, `admit_check`); a head that fails
waits, and so does everything behind it, so no later request overtakes it: the policy's order
(FCFS, priority tiers, VTC fairness across tenants) is kept, and an adapter that needs a slot is
never starved by a stream of requests for resident ones. Slots free up as running sequences of
other adapters finish.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.request import Sequence


def slot_admission(max_loras: int) -> Callable[[Sequence, list[Sequence]], bool]:
    def can_admit(seq: Sequence, running: list[Sequence]) -> bool:
        if seq.lora is None:
            return True
        in_use = {s.lora for s in running if s.lora is not None}
        return seq.lora in in_use or len(in_use) < max_loras

    return can_admit
