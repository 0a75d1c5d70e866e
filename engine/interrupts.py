"""Urgent prompts that start in the middle of a step: between two layers of the step in flight.

A step is one forward over every layer; an urgent request (a higher tier beside bulk work, a light
tenant beside a heavy one: the policy's ``urgent``) that arrives while a long step runs would wait
for the rest of it, then for its own prefill. With an ``Interrupt`` handed to ``Engine.step``, the
forward stops after each layer to ask the driver for the requests that have arrived (``poll``: it
adds them with ``Engine.add_request``); when the head of the queue is an urgent prompt that can start
whole, now, without touching anything running (Scheduler.schedule_interrupt), its step runs there,
nested, over every layer: prefill, sampling, outputs handed to the driver at once (``deliver``).
Then the step in flight goes on from the next layer and keeps stopping, so that an urgent prompt
arriving later in the same step starts too: up to ``MAX_NESTED`` nested steps a step (each costs a
pass over the weights, which the batch tier pays), then no further stops. The step in flight's
sequences, blocks and hidden states are untouched: the nested step uses other sequences and other
blocks, and the step in flight's tables were gathered before its forward. The step in flight's
measured time, which feeds the step-cost models, leaves out the nested step's.

Only on a CPU, where the forward runs as the host reaches it (a GPU runs the layers the host has
queued, later: a stop there gains nothing). The step in flight is not interrupted where a nested
step could disturb it: in MoE models (a forward counts the experts it ran), with grammar-constrained
requests in it (their bitmasks are prepared on a thread during the forward), or under static or
dynamic batching; and a nested step runs no adapter (the step in flight's adapter slots and segment
tables stay as they were built). The one-call C decode (engine/models/decode.py) calls the same
hook from its layer loop; CUDA graph replays have no point to stop at.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from engine.request import RequestOutput
from engine.scheduler import Scheduler, StepPlan
from engine.stats import EngineStats, StepRun

MAX_NESTED = 4  # nested steps inside one step in flight, at most


class EngineParts(Protocol):
    """What of an Engine a nested step uses (engine/engine.py, which imports this module)."""

    runner: Any  # ModelRunner
    scheduler: Scheduler
    requests: Any  # RequestTable
    stats: EngineStats
    block_manager: Any
    output: Any  # OutputProcessor


@dataclass
class Interrupt:
    """The driver's side: ``poll()`` adds the requests that arrived (between two layers of a step);
    ``deliver(outputs)`` takes the outputs of a nested step as soon as they exist (they are not
    returned again by the step in flight)."""

    poll: Callable[[], None]
    deliver: Callable[[list[RequestOutput]], None]


class Interrupts:
    """One engine's nested steps (see the module docstring)."""

    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine
        self.seconds = 0.0  # of the nested steps of the step in flight
        self.nested = 0  # nested steps run inside the step in flight
        self._interrupt: Interrupt | None = None

    @contextmanager
    def during(self, plan: StepPlan, interrupt: Interrupt | None) -> Iterator[Interrupts]:
        """Around the forward of ``plan``: nested steps may run between its layers."""
        self.seconds, self.nested = 0.0, 0
        model = self.engine.runner.model
        if interrupt is None or not self._may_interrupt(plan):
            yield self
            return
        self._interrupt, model.between_layers = interrupt, self._between_layers
        try:
            yield self
        finally:
            self._interrupt, model.between_layers = None, None

    def _may_interrupt(self, plan: StepPlan) -> bool:
        engine = self.engine
        return (
            engine.runner.device.type == "cpu"
            and engine.runner.model.experts is None
            and engine.scheduler.config.batching == "continuous"
            and not any(item.seq.params.structured is not None for item in plan.scheduled)
        )

    def _between_layers(self, layer: int) -> None:
        """After ``layer`` of the step in flight: take arrivals, then run an urgent prompt's step."""
        assert self._interrupt is not None
        self._interrupt.poll()
        engine = self.engine
        plan = engine.scheduler.schedule_interrupt()
        if plan.is_empty:
            return
        start = time.perf_counter()
        model = engine.runner.model
        model.between_layers = None  # no step inside a nested one
        try:
            sampled = engine.runner.run(plan, engine.requests.generators, None)
        finally:
            self.nested += 1
            if self.nested < MAX_NESTED:  # the step in flight stops again at its next layers
                model.between_layers = self._between_layers
        seconds = time.perf_counter() - start
        engine.scheduler.observe_step(plan, seconds)
        for item in plan.scheduled:
            item.seq.record("prefill_chunk", tokens=item.num_tokens, start=item.seq.num_computed_tokens)
        engine.scheduler.finish_step(plan)
        engine.stats.interrupts += 1
        engine.stats.record_step(
            plan,
            StepRun(sampled, seconds, 0),
            swap_seconds=0.0,
            scheduler=engine.scheduler,
            block_manager=engine.block_manager,
            lora=None,
        )
        outputs = engine.output.process(sampled, time.monotonic())
        self.seconds += time.perf_counter() - start
        self._interrupt.deliver(outputs)
