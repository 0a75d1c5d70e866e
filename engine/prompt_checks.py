"""The checks of a prompt, shared by the engine (``Engine.validate``) and the gateway (before a
request is charged), so that both refuse the same prompts in the same words. Plain Python."""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import ContextLengthExceededError, InvalidRequestError


def check_prompt(token_ids: Sequence[int], *, vocab_size: int, name: str = "The prompt") -> None:
    """Refuse a prompt that is not a non-empty list of token ids of the vocabulary (param ``prompt``).
    ``name``: how the message names it ("Prompt 2" for one of several)."""
    if not isinstance(token_ids, (list, tuple)) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in token_ids
    ):
        raise InvalidRequestError(f"{name} must be a list of token ids (integers).", param="prompt")
    if not token_ids:
        raise InvalidRequestError(f"{name} is empty.", param="prompt")
    if any(not 0 <= t < vocab_size for t in token_ids):
        raise InvalidRequestError(
            f"{name}'s token ids must be below the vocabulary size ({vocab_size}).", param="prompt"
        )


def check_context(
    num_prompt_tokens: int, max_tokens: int, *, max_model_len: int, prompt_param: str = "prompt"
) -> None:
    """Refuse prompt + max_tokens beyond the model's context: param ``prompt_param`` when the prompt
    alone does not fit, else ``max_tokens``."""
    total = num_prompt_tokens + max_tokens
    if total <= max_model_len:
        return
    if num_prompt_tokens >= max_model_len:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{num_prompt_tokens} tokens.",
            param=prompt_param,
        )
    raise ContextLengthExceededError(
        f"This model's maximum context length is {max_model_len} tokens, but {total} were requested "
        f"({num_prompt_tokens} in the prompt, {max_tokens} for the completion); shorten the prompt "
        "or lower max_tokens.",
        param="max_tokens",
    )


def check_token_ids(ids: object, name: str, *, vocab_size: int) -> None:
    """`ids` must be a list (or tuple) of integer token ids inside the vocabulary."""
    if not isinstance(ids, (list, tuple)) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise InvalidRequestError(f"{name} must be a list of token ids (integers)", param=name)
    if any(not 0 <= t < vocab_size for t in ids):
        raise InvalidRequestError(
            f"{name} holds token ids outside the vocabulary [0, {vocab_size})", param=name
        )
