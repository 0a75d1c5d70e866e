"""What changes a row's logits before sampling: min_tokens, logit_bias and the penalties, and the
log-probabilities handed back with tokens. One vectorised pass over the rows that ask for each;
rows that ask for nothing are never touched (a batch where none asks costs one Python loop).

Order (vLLM's): min_tokens and logit_bias, then repetition, frequency and presence penalties;
temperature, top-k and top-p come after, in the sampler. Definitions: SamplingParams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.device import host_to_device
from engine.request import Sequence, TokenLogprob

if TYPE_CHECKING:
    from engine.models.llama import LlamaModel

PROMPT_LOGITS_CHUNK = 256  # prompt positions turned into full-vocab logits at a time ([256, V] fp32)


def process_logits(logits: torch.Tensor, seqs: list[Sequence], eos_ids: frozenset[int]) -> torch.Tensor:
    """logits: [S, V] fp32, one row per sequence (changed in place and returned)."""
    rows = [i for i, s in enumerate(seqs) if s.params.processes_logits]
    if not rows:
        return logits
    device, vocab = logits.device, logits.shape[1]
    # min_tokens and logit_bias: (row, token, added value) triples, one accumulate index_put_
    r: list[int] = []
    t: list[int] = []
    v: list[float] = []
    for i in rows:
        seq, p = seqs[i], seqs[i].params
        if seq.num_output_tokens < p.min_tokens:
            stops = set(p.stop_token_ids) if p.ignore_eos else set(p.stop_token_ids) | eos_ids
            for token in stops:
                r.append(i)
                t.append(token)
                v.append(float("-inf"))
        for token, bias in p.logit_bias:
            r.append(i)
            t.append(token)
            v.append(bias)
    if r:
        index = (host_to_device(torch.tensor(r), device), host_to_device(torch.tensor(t), device))
        logits.index_put_(index, host_to_device(torch.tensor(v, dtype=logits.dtype), device), accumulate=True)
    penalised = [i for i in rows if seqs[i].params.has_penalties]
    if penalised:
        _penalties(
            logits, [seqs[i] for i in penalised], host_to_device(torch.tensor(penalised), device), vocab
        )
    return logits


def _padded(lists: list[list[int]], pad: int) -> torch.Tensor:
    width = max(1, max(len(x) for x in lists))
    return torch.tensor([x + [pad] * (width - len(x)) for x in lists])


def _penalties(logits: torch.Tensor, seqs: list[Sequence], rows: torch.Tensor, vocab: int) -> None:
    device = logits.device
    sub = logits[rows]  # [R, V]
    params = [s.params for s in seqs]
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        out = host_to_device(_padded([s.output_token_ids for s in seqs], vocab), device)  # [R, L], pad = V
        counts = torch.zeros(len(seqs), vocab + 1, dtype=sub.dtype, device=device)
        counts = counts.scatter_add_(1, out, torch.ones_like(out, dtype=sub.dtype))[:, :vocab]  # [R, V]
        freq = host_to_device(torch.tensor([p.frequency_penalty for p in params], dtype=sub.dtype), device)
        pres = host_to_device(torch.tensor([p.presence_penalty for p in params], dtype=sub.dtype), device)
        # OpenAI: logit -= count * frequency_penalty + (count > 0) * presence_penalty
        sub = sub - freq[:, None] * counts - pres[:, None] * (counts > 0).to(sub.dtype)
    if any(p.repetition_penalty != 1.0 for p in params):
        seen_ids = host_to_device(_padded([s.token_ids for s in seqs], vocab), device)  # prompt + output
        seen = torch.zeros(len(seqs), vocab + 1, dtype=torch.bool, device=device)
        seen = seen.scatter_(1, seen_ids, True)[:, :vocab]
        rep = host_to_device(torch.tensor([p.repetition_penalty for p in params], dtype=sub.dtype), device)[
            :, None
        ]
        # HF / vLLM (CTRL paper): a seen token's positive logit is divided, a negative one multiplied
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    logits[rows] = sub


def token_logprobs(raw_logprobs: torch.Tensor, token_ids: torch.Tensor, ks: list[int]) -> list[TokenLogprob]:
    """raw_logprobs: [R, V] fp32 log_softmax; token_ids: [R] the tokens chosen (or seen); ks: the
    top count per row. One host transfer of [R, 1 + max k] values."""
    chosen = raw_logprobs.gather(1, token_ids[:, None])[:, 0]  # [R]
    k = max(ks)
    top_lp_l: list[list[float]] = []
    top_ids_l: list[list[int]] = []
    if k:
        top_lp, top_ids = raw_logprobs.topk(k, dim=-1)  # [R, k]
        top_lp_l, top_ids_l = top_lp.tolist(), top_ids.tolist()
    chosen_l, ids_l = chosen.tolist(), token_ids.tolist()
    out = []
    for row, (token, lp, kr) in enumerate(zip(ids_l, chosen_l, ks)):
        top = tuple(zip(top_ids_l[row][:kr], top_lp_l[row][:kr])) if kr else ()
        out.append(TokenLogprob(token, lp, top))
    return out


def collect_prompt_logprobs(
    model: LlamaModel, hidden: torch.Tensor, seq: Sequence, first_row: int, start: int, n: int
) -> None:
    """Append to seq.prompt_logprobs what this prefill chunk's rows give: hidden row first_row + j
    holds position start + j, whose logits predict prompt token start + j + 1. Positions already
    collected (a recomputed prefill) are skipped; full-vocab logits are made PROMPT_LOGITS_CHUNK
    rows at a time."""
    have = len(seq.prompt_logprobs)  # tokens 0 .. have-1 are done
    lo = max(start, have - 1)  # first position still owed
    hi = min(start + n, seq.num_prompt_tokens - 1)  # positions up to the prompt's second-to-last token
    k = seq.params.prompt_logprobs or 0  # set: the caller checked needs_prompt_logits
    device = hidden.device
    for a in range(lo, hi, PROMPT_LOGITS_CHUNK):
        b = min(hi, a + PROMPT_LOGITS_CHUNK)
        lp = torch.log_softmax(model.logits(hidden[first_row + a - start : first_row + b - start]), dim=-1)
        targets = host_to_device(torch.tensor(seq.token_ids[a + 1 : b + 1]), device)
        seq.prompt_logprobs += token_logprobs(lp, targets, [k] * (b - a))
