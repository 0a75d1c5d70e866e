"""Log-probabilities in OpenAI's two shapes: chat's ``logprobs.content`` entries and the legacy
completions object (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``).

A token's text is its bytes decoded as UTF-8 (a token holding part of a character shows U+FFFD);
``bytes`` (chat) are the exact bytes. The values are the engine's: the model's raw distribution
(SamplingParams).
"""

from __future__ import annotations

from typing import Any

from engine import TokenLogprob
from gateway.api.tokenization import PromptTokenizer


def _text(tokenizer: PromptTokenizer, token_id: int) -> str:
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def _entry(tokenizer: PromptTokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    return {
        "token": _text(tokenizer, token_id),
        "logprob": logprob,
        "bytes": list(tokenizer.token_bytes(token_id)),
    }


def chat_logprobs(tokenizer: PromptTokenizer, logprobs: list[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs`` object."""
    content = [
        {
            **_entry(tokenizer, lp.token_id, lp.logprob),
            "top_logprobs": [_entry(tokenizer, t, v) for t, v in lp.top],
        }
        for lp in logprobs
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(
    tokenizer: PromptTokenizer,
    logprobs: list[TokenLogprob | None],
    *,
    text_offset: int = 0,
    first_token_id: int | None = None,
) -> dict[str, Any]:
    """A completions choice's ``logprobs`` object. A None entry is the prompt's first token (no
    logprob: nothing predicts it), whose id is `first_token_id`. top_logprobs maps a token's text to
    its logprob: the k most likely, plus the chosen token (as vLLM and OpenAI's legacy API do)."""
    tokens, values, tops, offsets = [], [], [], []
    offset = text_offset
    for lp in logprobs:
        token_id = first_token_id if lp is None else lp.token_id
        text = _text(tokenizer, token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if lp is None:
            values.append(None)
            tops.append(None)
            continue
        values.append(lp.logprob)
        top = {_text(tokenizer, t): v for t, v in lp.top}
        if lp.top:
            top.setdefault(text, lp.logprob)
        tops.append(top if lp.top else None)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
