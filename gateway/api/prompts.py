"""A request's prompts as token ids: tokenized off the event loop when long, refused before any
work when too long, and checked with the engine's own prompt checks (engine/prompt_checks.py), so
that the gateway and the engine refuse the same prompts in the same words."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread

from engine import EngineError, ErrorCode, check_prompt
from gateway.api.errors import InvalidRequest, refused_by_engine_checks
from gateway.api.state import GatewayState
from gateway.telemetry import path_marks


def _too_long(name: str, chars: int, limit: int, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"{name} has {chars} characters; this server accepts at most {limit}.",
        param=param,
        code=ErrorCode.CONTEXT_LENGTH_EXCEEDED.value,
    )


async def tokenize(
    state: GatewayState, encode: Callable[[Any], list[int]], arg: Any, chars: int, param: str
) -> list[int]:
    """``encode(arg)``, refusing an over-long prompt (``chars`` characters) before any work."""
    limit = state.settings.max_prompt_chars
    if chars > limit:
        raise _too_long("The prompt", chars, limit, param)
    return await encode_off_loop(state, encode, arg, chars)


async def encode_off_loop(state: GatewayState, encode: Callable[[Any], Any], arg: Any, chars: int) -> Any:
    """``encode(arg)``, in a thread when ``chars`` is long, so that one client's huge prompt never
    delays another's request."""
    if chars <= state.settings.tokenize_inline_chars:
        path_marks.mark("tokenized_in")
        encoded = encode(arg)
        path_marks.mark("tokenized_out")
        return encoded
    return await anyio.to_thread.run_sync(encode, arg, limiter=state.tokenize_limiter)


async def completion_prompt_ids(state: GatewayState, prompts: list[str | list[int]]) -> list[list[int]]:
    """Each prompt's token ids; any bad prompt (too long, empty, a token id outside the
    vocabulary) refuses the whole request, naming it, before anything is charged or queued."""
    limit = state.settings.max_prompt_chars
    texts = [p for p in prompts if isinstance(p, str)]

    def name(i: int) -> str:
        return "The prompt" if len(prompts) == 1 else f"Prompt {i}"

    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str) and len(prompt) > limit:
            raise _too_long(name(i), len(prompt), limit, "prompt")
    tokenizer = state.tokenizer
    encoded = iter(
        await encode_off_loop(
            state, lambda ts: [tokenizer.encode_prompt(t) for t in ts], texts, sum(map(len, texts))
        )
    )
    all_ids = []
    for i, prompt in enumerate(prompts):
        ids = next(encoded) if isinstance(prompt, str) else list(prompt)
        try:
            check_prompt(ids, vocab_size=tokenizer.vocab_size, name=name(i))
        except EngineError as exc:
            raise refused_by_engine_checks(exc) from exc
        all_ids.append(ids)
    return all_ids


def resolve_max_tokens(
    requested: int | None, *, prompt_tokens: int, max_model_len: int | None, default: int, cap: int | None
) -> int:
    """The request's max_tokens: the client's, else the server default, lowered to the context left
    and to the quota's per-request cap (a cap of 0 is left for the quota to refuse)."""
    if requested is not None:
        return requested
    max_tokens = default
    if max_model_len is not None:
        max_tokens = min(max_tokens, max_model_len - prompt_tokens)
    if cap is not None:
        max_tokens = min(max_tokens, cap)
    return max(1, max_tokens)


def relay_ids(request_id: str, count: int) -> list[str]:
    """The engine request ids of a request's prompts: its own id for one prompt, ``id-i`` for several."""
    return [request_id] if count == 1 else [f"{request_id}-{i}" for i in range(count)]
