"""OpenAI response bodies and stream chunks for chat and text completions, built in one place."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.api.errors import GatewayError, error_body

SYSTEM_FINGERPRINT = "fp_fairlane_0.1.0"  # the engine build (OpenAI: a string naming the backend config)
# The engine finishes with stop | length | abort; OpenAI clients know stop and length.
_FINISH = {"stop": "stop", "length": "length", "abort": "stop", "tool_calls": "tool_calls"}


def finish_reason(reason: str | None) -> str | None:
    return _FINISH.get(reason, reason) if reason else None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens: prompt tokens whose KV came from the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _envelope(kind: str, request_id: str, created: int, model: str, tier: str) -> dict[str, Any]:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {
        "id": f"{prefix}-{request_id}",
        "object": kind,
        "created": created,
        "model": model,
        "service_tier": tier,
        "system_fingerprint": f"{SYSTEM_FINGERPRINT}_{model}",
    }


@dataclass
class Choice:
    """One choice of a response: its text, why it ended, its logprobs object (or None), and the
    functions it called (chat with tools, gateway/api/tools.py)."""

    text: str | None
    reason: str | None
    logprobs: dict[str, Any] | None = None
    tool_calls: list | None = None


def chat_completion(
    *,
    request_id: str,
    created: int,
    model: str,
    tier: str,
    choices: list[Choice],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    body = _envelope("chat.completion", request_id, created, model, tier)
    body["choices"] = []
    for i, c in enumerate(choices):
        message, reason = {"role": "assistant", "content": c.text, "refusal": None}, c.reason
        if c.tool_calls:  # the model called functions
            message["tool_calls"], reason = c.tool_calls, "tool_calls"
        body["choices"].append(
            {"index": i, "message": message, "logprobs": c.logprobs, "finish_reason": finish_reason(reason)}
        )
    body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
    return body


def text_completion(
    *,
    request_id: str,
    created: int,
    model: str,
    tier: str,
    choices: list[Choice],
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    body = _envelope("text_completion", request_id, created, model, tier)
    body["choices"] = [
        {"index": i, "text": c.text, "logprobs": c.logprobs, "finish_reason": finish_reason(c.reason)}
        for i, c in enumerate(choices)
    ]
    body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
    return body


def chat_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    tier: str,
    delta: dict[str, Any] | None,
    reason: str | None = None,
    usage_body: dict[str, int] | None = None,
    with_usage_field: bool = False,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """A chat.completion.chunk; ``delta=None`` makes the final usage-only chunk (choices: [])."""
    body = _envelope("chat.completion.chunk", request_id, created, model, tier)
    body["choices"] = (
        []
        if delta is None
        else [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason(reason)}]
    )
    if with_usage_field or usage_body is not None:
        body["usage"] = usage_body
    return body


def text_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    tier: str,
    text: str | None,
    reason: str | None = None,
    usage_body: dict[str, int] | None = None,
    with_usage_field: bool = False,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """A streamed text_completion; ``text=None`` makes the final usage-only chunk (choices: [])."""
    body = _envelope("text_completion", request_id, created, model, tier)
    body["choices"] = (
        []
        if text is None
        else [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(reason)}]
    )
    if with_usage_field or usage_body is not None:
        body["usage"] = usage_body
    return body


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def sse_error(error: GatewayError) -> bytes:
    return sse(error_body(error.message, error.error_type, error.param, error.code))


SSE_DONE = sse("[DONE]")
SSE_KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: ignored by clients, keeps the connection alive
