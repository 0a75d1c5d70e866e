"""Which running sequences speculate in a step, and how many drafts they may take: one rule for
every drafting method.

Acceptance-aware, as vLLM's and SGLang's dynamic speculation: each verification moves the
sequence's running share of drafts kept (Sequence.draft_acceptance, an exponential average of
weight ACCEPTANCE_WEIGHT, starting at 1) toward that step's share. Below min_acceptance the drafts
cost more verification rows than the tokens they save, so the sequence decodes without drafts;
after probe_interval such steps it drafts again (a probe) until a verification updates the average:
one that starts copying its prompt again speculates again.

Length-adaptive, as transformers' heuristic draft schedule: a sequence whose drafts were all kept
is copying a run of its text, so its next draft may be twice as long (Sequence.draft_limit, up to
max_num_speculative_tokens); one with a rejection drafts k again: the copied run has ended, and
the next match starts a new one. A verification row costs a fraction of a step, so long drafts pay
inside a copied run and short ones cost little where the run ends."""

from __future__ import annotations

from engine.request import Sequence
from engine.speculative.config import SpeculativeConfig

ACCEPTANCE_WEIGHT = 0.3  # of the latest verification in the running share of drafts kept


def draft_room(
    seq: Sequence, config: SpeculativeConfig, budget: int, num_running: int, max_model_len: int
) -> int:
    """How many drafts `seq`'s decode may take this step (it has `budget` tokens beyond its one):
    0 where it does not speculate: a batch above max_decoding_seqs, a priority below min_priority,
    a grammar (drafts are not checked against it), penalties, logit_bias or min_tokens (they change
    with every accepted token), a share of drafts kept below min_acceptance (but for a probe every
    probe_interval steps; counted here). Capped at the sequence's draft limit (k at first, and after
    a rejection; doubled by a draft kept whole, up to max_num_speculative_tokens), and so that
    neither max_tokens nor the context is passed."""
    params = seq.params
    if (
        num_running > config.max_decoding_seqs
        or seq.priority < config.min_priority
        or params.structured is not None
        or params.processes_logits
    ):
        return 0
    if seq.draft_acceptance < config.min_acceptance:
        seq.draft_skipped += 1
        if seq.draft_skipped <= config.probe_interval:
            return 0
    seq.draft_limit = min(max(seq.draft_limit, config.num_speculative_tokens), config.max_draft_tokens)
    return max(
        0,
        min(
            seq.draft_limit,
            budget,
            params.max_tokens - seq.num_output_tokens - 1,  # the bonus token is the last one allowed
            max_model_len - seq.num_tokens,  # the last draft's position stays inside the context
        ),
    )


def observe(seq: Sequence, drafted: int, accepted: int) -> None:
    """One verification of `seq`'s `drafted` drafts, `accepted` of them kept: its running share of
    drafts kept moves toward accepted / drafted, its count of steps without drafts restarts, and
    its draft limit doubles where every draft was kept, else falls back to k (draft_room keeps it
    within k .. max_num_speculative_tokens)."""
    seq.draft_acceptance += ACCEPTANCE_WEIGHT * (accepted / drafted - seq.draft_acceptance)
    seq.draft_skipped = 0
    seq.draft_limit = 2 * seq.draft_limit if accepted == drafted else 0
