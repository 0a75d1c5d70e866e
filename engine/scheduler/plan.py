"""One step's plan: which sequences compute how many tokens, and which KV blocks to copy first."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import Sequence

PENDING_DRAFT = -1  # a draft entry whose token the drafter computes after scheduling (Drafter.complete)


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens computed this step, from seq.num_computed_tokens on
    # Speculative decoding (engine/speculative): draft tokens after a decode's one token, verified in
    # this step's forward; their KV slots are allocated, and those of rejected drafts given back.
    draft: list[int] = field(default_factory=list)

    @property
    def num_query_tokens(self) -> int:
        """Rows this item puts in the forward: its tokens, then its drafts."""
        return self.num_tokens + len(self.draft)

    @property
    def samples(self) -> bool:
        """Does this chunk reach the end of the sequence (so a new token is sampled)?"""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens

    # The one definition of a decode. Two questions use it, and they differ on one case, a prompt
    # whose last token is all that is left to compute (a prefix-cache hit of the rest, a one-token
    # prompt): its step costs and batches as a decode, but it is a prompt token, not an output one.
    @property
    def is_decode(self) -> bool:
        """One token that samples the next: a decode to the scheduler, the step-cost model and the
        runner (one query row on the attention backend's decode path)."""
        return self.num_tokens == 1 and not self.draft and self.samples

    @property
    def is_output_decode(self) -> bool:
        """A decode of an output token sampled in an earlier step: what the engine's stats count as
        a decode token (every other computed token is a prefill token)."""
        return self.num_tokens == 1 and self.samples and self.seq.num_output_tokens > 0


@dataclass
class StepPlan:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    refused: list[tuple[Sequence, Exception]] = field(default_factory=list)  # waiting, refused by the policy
    # Block copies the runner does before the forward, swap_out first: (device block, host block)
    # of sequences swapped out in this step, then (host block, device block) of those swapped in.
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_query_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
