"""OpenAI-compatible POST /v1/chat/completions and POST /v1/completions (streamed or not)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway import generation as gen
from gateway import openai_format as fmt
from gateway.deps import CurrentKey, StateDep
from gateway.errors import GatewayError, InvalidRequest, NotFound
from gateway.quota_seam import QuotaDep
from gateway.schemas.openai import ChatCompletionRequest, CompletionRequest
from gateway.state import GatewayState
from gateway.tiers import resolve_tier

router = APIRouter(prefix="/v1", tags=["openai"])


def _check_model(state: GatewayState, model: str) -> None:
    if model != state.settings.model_name:
        raise NotFound(f"The model '{model}' does not exist or you do not have access to it.",
                       param="model", code="model_not_found")


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, auth: CurrentKey, state: StateDep,
                           quota: QuotaDep):
    """Creates a model response for the given chat conversation."""
    _check_model(state, body.model)
    tier = resolve_tier(auth, body.service_tier, state.settings.tiers)
    body.sampling(max_tokens=1)  # refuse unsupported options before tokenizing
    try:
        prompt_ids = state.tokenizer.encode_chat([m.as_template_input() for m in body.messages])
    except Exception as exc:  # jinja errors, bad roles for this template…
        raise InvalidRequest(f"These messages cannot be rendered by the model's chat template: {exc}",
                             param="messages") from exc
    generation = await gen.start(state, quota, auth, request_id=request.state.request_id, tier=tier,
                                 prompt_ids=prompt_ids, requested_max_tokens=body.requested_max_tokens(),
                                 sampling_for=body.sampling, traceparent=request.headers.get("traceparent"))
    return await _respond(generation, body, request, chat=True)


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request, auth: CurrentKey, state: StateDep,
                      quota: QuotaDep):
    """Creates a completion for the provided prompt."""
    _check_model(state, body.model)
    tier = resolve_tier(auth, body.service_tier, state.settings.tiers)
    body.sampling(max_tokens=1)
    prompt = body.single_prompt()
    prompt_ids = state.tokenizer.encode_prompt(prompt) if isinstance(prompt, str) else list(prompt)
    if not prompt_ids:
        raise InvalidRequest("The prompt is empty.", param="prompt")
    generation = await gen.start(state, quota, auth, request_id=request.state.request_id, tier=tier,
                                 prompt_ids=prompt_ids, requested_max_tokens=body.requested_max_tokens(),
                                 sampling_for=body.sampling, prompt_param="prompt",
                                 traceparent=request.headers.get("traceparent"))
    return await _respond(generation, body, request, chat=False)


async def _respond(generation: gen.Generation, body, request: Request, *, chat: bool):
    headers = generation.admission.headers
    ids = dict(request_id=generation.request_id, created=generation.created, model=generation.model,
               tier=generation.tier)
    if body.stream:
        return StreamingResponse(_stream(generation, body, chat, ids), media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})
    parts: list[str] = []
    failure: list[BaseException] = []

    async def collect(scope: anyio.CancelScope) -> None:
        try:
            async for result in generation:
                parts.append(result.text)
        except Exception as exc:  # re-raised below, outside the task group (no ExceptionGroup)
            failure.append(exc)
        scope.cancel()

    async def watch_disconnect(scope: anyio.CancelScope) -> None:
        while not await request.is_disconnected():
            await anyio.sleep(0.25)
        scope.cancel()  # the client left: stop relaying; close() cancels the request

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(collect, tasks.cancel_scope)
            tasks.start_soon(watch_disconnect, tasks.cancel_scope)
    finally:
        await generation.close()
    if failure:
        raise failure[0]
    if not generation.done:
        return JSONResponse({}, status_code=499)  # nobody is listening any more
    build = fmt.chat_completion if chat else fmt.text_completion
    return JSONResponse(build(**ids, text="".join(parts), reason=generation.finish_reason,
                              prompt_tokens=generation.prompt_tokens,
                              completion_tokens=generation.completion_tokens), headers=headers)


async def _stream(generation: gen.Generation, body, chat: bool, ids: dict) -> AsyncIterator[bytes]:
    chunk = partial(fmt.chat_chunk if chat else fmt.text_chunk, **ids, with_usage_field=body.include_usage)

    def usage_now():
        return fmt.usage(generation.prompt_tokens, generation.completion_tokens)

    try:
        if chat:
            yield fmt.sse(chunk(delta={"role": "assistant", "content": ""}))
        async for result in generation:
            if not result.text and not result.finished:
                continue  # e.g. a token that completes no character yet
            reason = result.finish_reason if result.finished else None
            content = {"content": result.text} if result.text or not result.finished else {}
            per_chunk_usage = usage_now() if body.continuous_usage else None
            yield fmt.sse(chunk(delta=content, reason=reason, usage_body=per_chunk_usage) if chat
                          else chunk(text=result.text, reason=reason, usage_body=per_chunk_usage))
        if body.include_usage:
            yield fmt.sse(chunk(delta=None, usage_body=usage_now()) if chat
                          else chunk(text=None, usage_body=usage_now()))
    except GatewayError as exc:
        yield fmt.sse_error(exc)
    finally:
        await generation.close()
    yield fmt.SSE_DONE
