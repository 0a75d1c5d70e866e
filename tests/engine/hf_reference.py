"""The reference the engine is held to: Hugging Face `generate`, greedy."""

import torch


def hf_greedy(model, prompts: list[list[int]], max_tokens: list[int], eos: bool = False) -> list[list[int]]:
    """Hugging Face `generate`, greedy, one prompt at a time (no padding effects)."""
    outs = []
    for ids, n in zip(prompts, max_tokens):
        kwargs = {} if eos else dict(eos_token_id=None)
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            min_new_tokens=0 if eos else n,
            do_sample=False,
            pad_token_id=0,
            **kwargs,
        )
        gen = out[0, len(ids) :].tolist()
        if eos and model.generation_config.eos_token_id in gen:  # keep up to and including EOS
            gen = gen[: gen.index(model.generation_config.eos_token_id) + 1]
        outs.append(gen)
    return outs
