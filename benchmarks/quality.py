"""INT8's quality against fp32 on the same model, as the throughput benchmark reports it beside
INT8's speed: perplexity on a fixed text (one prefill, teacher-forced) and greedy agreement over
a prompt set (the share of tokens produced before the first divergence, and the outputs that are
identical throughout)."""

from __future__ import annotations

import math

import torch

from engine import LLM, SamplingParams

TEXT = (
    "The lighthouse stood on a rock a mile from the coast, and its keeper climbed the stairs every "
    "evening to light the lamp. In winter the storms came from the west, and the waves broke over the "
    "rock so hard that the whole tower shook. Ships passing in the night saw the light turn and knew "
    "where the reef lay. When the keeper grew old, a young woman from the village learned the work: "
    "how to trim the wick, how to wind the clockwork that turned the lens, and how to write the log "
    "that recorded the weather, the ships and the hours of the light. Years later the lamp was "
    "electrified and the keepers left, but the villagers still tell the story of the night the light "
    "failed and the keeper held a lantern in the window until dawn."
)


def perplexity(llm: LLM, text: str = TEXT) -> float:
    """exp(mean negative log-likelihood) of `text`'s tokens after the first, in one forward."""
    ids = llm.tokenizer(text)["input_ids"]
    engine = llm.engine
    engine.add_request("quality-ppl", ids, SamplingParams(max_tokens=1, temperature=0))
    try:
        items, hidden, _ = engine.runner.forward(engine.scheduler.schedule())
        logits = engine.runner.model.logits(hidden[: len(ids)])
    finally:
        engine.abort("quality-ppl")
    nll = -torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None]).mean()
    return math.exp(nll.item())


def greedy_agreement(reference: LLM, candidate: LLM, prompts: list[list[int]], tokens: int = 32) -> dict:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    ref = [c.token_ids for c in reference.generate(prompts, params)]
    got = [c.token_ids for c in candidate.generate(prompts, params)]
    before = [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), len(r)) for r, g in zip(ref, got)]
    return {
        "prompts": len(prompts),
        "tokens": tokens,
        "share_before_divergence": sum(before) / sum(map(len, ref)),
        "identical": sum(b == len(r) for b, r in zip(before, ref)),
    }


def int8_quality(fp32: LLM, int8: LLM, prompts: list[list[int]]) -> dict:
    p32, p8 = perplexity(fp32), perplexity(int8)
    return {
        "perplexity_fp32": p32,
        "perplexity_int8": p8,
        "perplexity_ratio": p8 / p32,
        **{f"greedy_{k}": v for k, v in greedy_agreement(fp32, int8, prompts).items()},
    }
