"""n > 1: the choices of one request, each its own sequence over the same prompt.

Choice 0 runs alone until its prompt is computed (its first token): its full prompt blocks are then
in the prefix cache, and choices 1..n-1 join the scheduler and share them (each computes only the
last partial block). Choice i's sequence id is "{request id}#i"; its seed is the request's + i.
The request is over when its last choice finishes. The state lives in the RequestTable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from engine.request import Sequence
from engine.request_table import RequestTable
from engine.scheduler import Scheduler


def later_choices(first: Sequence, pin_lora: Callable[[], str | None]) -> list[Sequence]:
    """Choices 1..n-1 of `first`'s request (each pins the adapter again through `pin_lora`)."""
    params, request_id = first.params, first.request_id
    choices = []
    for i in range(1, params.n):
        seed = None if params.seed is None else params.seed + i
        choices.append(
            Sequence(
                request_id=f"{request_id}#{i}",
                token_ids=list(first.prompt_token_ids),
                num_prompt_tokens=first.num_prompt_tokens,
                params=replace(params, n=1, prompt_logprobs=None, seed=seed),
                tenant=first.tenant,
                weight=first.weight,
                priority=first.priority,
                arrival_time=first.arrival_time,
                tpot_target_s=first.tpot_target_s,
                lora=pin_lora(),
                group=request_id,
                index=i,
            )
        )
    return choices


class Choices:
    """The n > 1 bookkeeping of a RequestTable: which choices wait for choice 0, which are open."""

    def __init__(self, requests: RequestTable, scheduler: Scheduler):
        self.requests = requests
        self.scheduler = scheduler

    def add(self, first: Sequence, later: list[Sequence]) -> None:
        """`first` is in the scheduler; `later` wait for its first token (see `start`)."""
        request_id = first.request_id
        self.requests.unstarted_choices[request_id] = later
        self.requests.choice_ids[request_id] = [request_id] + [c.request_id for c in later]
        self.requests.open_choices[request_id] = first.params.n

    def start(self, first: Sequence) -> None:
        """Choice 0 has its first token: the other choices join the scheduler."""
        for choice in self.requests.unstarted_choices.pop(first.request_id, ()):
            self.scheduler.add(choice)
            self.requests.add(choice)

    def finish(self, seq: Sequence) -> bool:
        """`seq` produced a token (finishing it or not): is its whole request over now?"""
        done = seq.finish_reason is not None
        request_id = seq.group or seq.request_id
        open_choices = self.requests.open_choices
        if request_id not in open_choices:  # n == 1
            return done
        open_choices[request_id] -= done
        if open_choices[request_id]:
            return False
        del open_choices[request_id], self.requests.choice_ids[request_id]
        return True

    def end(self, request_id: str) -> tuple[list[str], list[Sequence]]:
        """The request ends early (aborted, refused): the sequence ids of its choices (just
        `request_id` for n == 1), and the choices that never started, for the caller to release."""
        seq_ids = self.requests.choice_ids.pop(request_id, [request_id])
        self.requests.open_choices.pop(request_id, None)
        return seq_ids, self.requests.unstarted_choices.pop(request_id, [])
