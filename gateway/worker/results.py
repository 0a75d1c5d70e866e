"""What the worker publishes on a request's result stream for an engine output or refusal."""

from __future__ import annotations

from typing import Any

from engine import ErrorCode, RequestOutput
from gateway.lanes.messages import LaneResult


def error_result(
    worker: str, request_id: str, exc: Exception, *, offset: int = 0, num_prompt_tokens: int = 0
) -> LaneResult:
    """An engine refusal as the request's last result (retry_after_s for SLO refusals)."""
    error: Any = exc
    return LaneResult(
        request_id=request_id,
        kind="error",
        done=True,
        offset=offset,
        worker=worker,
        num_prompt_tokens=num_prompt_tokens,
        error_message=getattr(error, "message", str(exc)),
        error_param=getattr(error, "param", None),
        error_code=str(getattr(error, "code", ErrorCode.ENGINE_ERROR)),
        retry_after_s=getattr(error, "retry_after", None),
    )


def output_result(
    worker: str,
    out: RequestOutput,
    offset: int,
    choice_offset: int,
    *,
    text_of_ids: bool,
    quota_settled: bool = False,
) -> LaneResult:
    """One engine output as a result: ``offset``, the tokens of choice 0 already published (an
    error's offset); ``choice_offset``, those of the output's own choice; ``text_of_ids``: the model
    has no tokenizer (random weights), the text shows the token ids; ``quota_settled``: the publish
    settles the request's quota with this, its last result."""
    if out.error is not None:  # refused at a step start (SLO): no token was produced
        return error_result(
            worker, out.request_id, out.error, offset=offset, num_prompt_tokens=out.num_prompt_tokens
        )
    text = "".join(f" t{t}" for t in out.new_token_ids) if text_of_ids else out.new_text
    return LaneResult(
        request_id=out.request_id,
        token_ids=tuple(out.new_token_ids),
        text=text,
        offset=choice_offset,
        done=bool(out.done),
        finish_reason=out.finish_reason,
        num_prompt_tokens=out.num_prompt_tokens,
        index=out.index,
        num_output_tokens=out.num_output_tokens,
        worker=worker,
        logprobs=None if out.logprobs is None else tuple(out.logprobs),
        num_cached_tokens=out.num_cached_tokens,
        prompt_logprobs=None if out.prompt_logprobs is None else tuple(out.prompt_logprobs),
        quota_settled=quota_settled,
    )
