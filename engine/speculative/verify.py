"""Verification of a step's drafts, and what it leaves behind.

A speculating sequence computes its one decode token and its k drafts in the step's forward (k + 1
query rows, causal over its paged KV, as a prefill chunk does), so the forward gives the target's
logits after each of them. `verify` turns those rows into the tokens kept:
- greedy: the longest prefix of drafts equal to the target's argmax, then the target's own token at
  the first mismatch (or after the last draft): token-identical to decoding without drafts;
- sampled: a prompt-lookup draft is a point mass, and so is a draft model's argmax draft, so
  draft x at a position is kept with probability p(x) (p: the target's distribution after
  temperature, top-k and top-p); on rejection the token is drawn from p with x removed,
  renormalised, and verification stops there (Leviathan et al.'s rule for a one-hot draft
  distribution: every token is distributed exactly as p). A seeded sequence draws from its own
  generator.
`tally` counts each sequence's drafts and accepted drafts (and tells the policy, policy.observe);
`settle` then advances each speculating sequence over its kept drafts (their KV is written) and
gives back the blocks of rejected ones, so num_computed_tokens and block tables stay consistent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine.logits_processing import token_logprobs
from engine.request import TokenLogprob
from engine.sampler import _top_k_top_p
from engine.speculative.policy import observe

if TYPE_CHECKING:
    from engine.kv_groups import Blocks
    from engine.output import Sampled
    from engine.request import Sequence as Seq
    from engine.scheduler import ScheduledSeq, StepPlan
    from engine.stats import EngineStats


def split_drafted(
    samplers: list[ScheduledSeq], logits: torch.Tensor
) -> tuple[list[ScheduledSeq], torch.Tensor, list[ScheduledSeq], torch.Tensor]:
    """The sampling items with drafts and their logits rows (k + 1 each), then the others and
    theirs (one each), from the step's sampling rows in `samplers` order."""
    drafted_rows: list[int] = []
    plain_rows: list[int] = []
    row = 0
    for it in samplers:
        n = len(it.draft) + 1 if it.draft else 1
        (drafted_rows if it.draft else plain_rows).extend(range(row, row + n))
        row += n
    if not plain_rows:  # every sampling item drafted (batch 1): its rows as they are, no copy
        return samplers, logits, [], logits[:0]
    index = torch.tensor(drafted_rows, device=logits.device)
    plain = torch.tensor(plain_rows, dtype=torch.long, device=logits.device)
    return (
        [it for it in samplers if it.draft],
        logits[index],
        [it for it in samplers if not it.draft],
        logits[plain],
    )


def verify(
    items: list[ScheduledSeq], logits: torch.Tensor, generators: dict[str, torch.Generator]
) -> list[Sampled]:
    """`logits`: [sum(k_i + 1), V] fp32, each item's rows in order. Returns (item, token, logprob)
    for every kept token, in order, each item's tokens together."""
    out: list[Sampled] = []
    greedy_ids = logits.argmax(dim=-1).tolist()
    row = 0
    for it in items:
        k = len(it.draft)
        rows = logits[row : row + k + 1]
        params = it.seq.params
        if params.greedy:
            target = greedy_ids[row : row + k + 1]
            m = 0
            while m < k and it.draft[m] == target[m]:
                m += 1
            tokens = it.draft[:m] + [target[m]]
        else:
            tokens = _rejection_sample(rows, it, generators.get(it.seq.request_id))
        row += k + 1
        logprobs: list[TokenLogprob | None] = [None] * len(tokens)
        if params.logprobs is not None:
            raw = torch.log_softmax(rows[: len(tokens)], dim=-1)
            ids = torch.tensor(tokens, device=logits.device)
            logprobs = list(token_logprobs(raw, ids, [params.logprobs] * len(tokens)))
        out += [(it, token, lp) for token, lp in zip(tokens, logprobs)]
    return out


def _rejection_sample(rows: torch.Tensor, it: ScheduledSeq, gen: torch.Generator | None) -> list[int]:
    params = it.seq.params
    k = len(it.draft)
    scaled = (
        rows.float().cpu() / params.temperature
    )  # draws on the host: a seed gives the same tokens anywhere
    if params.top_k > 0 or params.top_p < 1:
        scaled = _top_k_top_p(scaled, [params] * (k + 1))
    probs = torch.softmax(scaled, dim=-1)
    uniforms = torch.rand(k, generator=gen, dtype=torch.float64).tolist()
    tokens: list[int] = []
    for i, x in enumerate(it.draft):
        if uniforms[i] < float(probs[i, x]):
            tokens.append(x)
            continue
        residual = probs[i].clone()
        residual[x] = 0.0
        total = float(residual.sum())
        if total <= 0.0:  # p was a point mass on x, so the draw above cannot have rejected it
            tokens.append(x)
            continue
        tokens.append(int(torch.multinomial(residual / total, 1, generator=gen)))
        return tokens
    tokens.append(int(torch.multinomial(probs[k], 1, generator=gen)))  # the bonus token
    return tokens


def tally(plan: StepPlan, sampled: Sequence[Sampled], stats: EngineStats) -> list[tuple[Seq, int]]:
    """Before the output processor: each speculating sequence's drafts and accepted drafts (its kept
    tokens but the last) counted in `stats` and on the sequence (Sequence.num_draft_tokens and
    num_accepted_tokens, which its RequestOutput carries). Returns (sequence, accepted drafts)."""
    stats.last_step_spec_seqs = stats.last_step_spec_draft_tokens = stats.last_step_spec_accepted_tokens = 0
    kept: dict[int, int] = {}
    for item, _, _ in sampled:
        if item.draft:
            kept[id(item)] = kept.get(id(item), 0) + 1
    verified: list[tuple[Seq, int]] = []
    for item in plan.scheduled:
        if not item.draft:
            continue
        accepted = kept.get(id(item), 1) - 1
        seq = item.seq
        stats.record_verification(seq.priority, len(item.draft), accepted)
        seq.num_draft_tokens += len(item.draft)
        seq.num_accepted_tokens += accepted
        observe(seq, len(item.draft), accepted)
        verified.append((seq, accepted))
    return verified


def settle(verified: list[tuple[Seq, int]], block_manager: Blocks) -> None:
    """After the output processor appended the kept tokens: each live speculating sequence's kept
    drafts become computed tokens (and registered for prefix sharing); the blocks past its
    computed tokens (rejected drafts' slots) return to the free list."""
    for seq, accepted in verified:
        if seq.is_finished:  # released: its blocks are free already
            continue
        seq.num_computed_tokens += accepted
        block_manager.commit(seq)
        block_manager.trim(seq)
