"""OpenAI response bodies and stream chunks for chat and text completions, built in one place."""

from __future__ import annotations

import json
from typing import Any

from gateway.api.errors import GatewayError, error_body

SYSTEM_FINGERPRINT = "fp_fairlane_0.1.0"  # the engine build (OpenAI: a string naming the backend config)
# The engine finishes with stop | length | abort; OpenAI clients know stop and length.
_FINISH = {"stop": "stop", "length": "length", "abort": "stop", "tool_calls": "tool_calls"}


def finish_reason(reason: str | None) -> str | None:
    return _FINISH.get(reason, reason) if reason else None


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _envelope(kind: str, request_id: str, created: int, model: str, tier: str) -> dict[str, Any]:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{request_id}", "object": kind, "created": created, "model": model,
            "service_tier": tier, "system_fingerprint": f"{SYSTEM_FINGERPRINT}_{model}"}


def chat_completion(*, request_id: str, created: int, model: str, tier: str, text: str | None, reason: str | None,
                    prompt_tokens: int, completion_tokens: int, tool_calls: list | None = None) -> dict[str, Any]:
    body = _envelope("chat.completion", request_id, created, model, tier)
    message = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:  # the model called functions (gateway/api/tools.py)
        message["tool_calls"], reason = tool_calls, "tool_calls"
    body["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(reason)}]
    body["usage"] = usage(prompt_tokens, completion_tokens)
    return body


def text_completion(*, request_id: str, created: int, model: str, tier: str, text: str, reason: str | None,
                    prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    body = _envelope("text_completion", request_id, created, model, tier)
    body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(reason)}]
    body["usage"] = usage(prompt_tokens, completion_tokens)
    return body


def chat_chunk(*, request_id: str, created: int, model: str, tier: str, delta: dict[str, Any] | None,
               reason: str | None = None, usage_body: dict[str, int] | None = None,
               with_usage_field: bool = False) -> dict[str, Any]:
    """A chat.completion.chunk; ``delta=None`` makes the final usage-only chunk (choices: [])."""
    body = _envelope("chat.completion.chunk", request_id, created, model, tier)
    body["choices"] = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason(reason)}]
    if with_usage_field or usage_body is not None:
        body["usage"] = usage_body
    return body


def text_chunk(*, request_id: str, created: int, model: str, tier: str, text: str | None,
               reason: str | None = None, usage_body: dict[str, int] | None = None,
               with_usage_field: bool = False) -> dict[str, Any]:
    """A streamed text_completion; ``text=None`` makes the final usage-only chunk (choices: [])."""
    body = _envelope("text_completion", request_id, created, model, tier)
    body["choices"] = [] if text is None else [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(reason)}]
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
