"""OpenAI-compatible POST /v1/chat/completions and POST /v1/completions (streamed or not)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from gateway.api import logprobs_format as lp_fmt
from gateway.api import openai_format as fmt
from gateway.api import tools
from gateway.api.admit import GenerationRequest, start
from gateway.api.auth import AuthContext
from gateway.api.deps import CurrentKey, StateDep
from gateway.api.errors import CLIENT_CLOSED_REQUEST, ERROR_RESPONSES, GatewayError, InvalidRequest
from gateway.api.first_results import DISCONNECT_POLL_S
from gateway.api.model_selection import select_model
from gateway.api.prompts import completion_prompt_ids, tokenize
from gateway.api.quota_service import QuotaDep
from gateway.api.relay import Generation
from gateway.api.routes.lean_route import LeanRoute
from gateway.api.schemas.openai import ChatCompletionRequest, CompletionRequest
from gateway.api.state import GatewayState
from gateway.api.tiers import openai_tier, resolve_tier
from gateway.lanes.messages import LaneAdapter

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES, route_class=LeanRoute)
# With "stream": true the 200 is server-sent events (OpenAI's chunks, then "data: [DONE]").
STREAMED = {
    200: {
        "description": "The response, or with `stream` its chunks as server-sent events",
        "content": {"text/event-stream": {"schema": {}}},
    }
}


async def _check_model(
    state: GatewayState, auth: AuthContext, model: str, top_k: int | None
) -> LaneAdapter | None:
    adapter = await select_model(
        state, auth, model
    )  # the base model (None) or the tenant's adapter; else 404
    vocab = state.tokenizer.vocab_size
    if top_k is not None and top_k > vocab:
        raise InvalidRequest(
            f"top_k must be at most the vocabulary size ({vocab}); 0 means no limit.", param="top_k"
        )
    return adapter


def _check_token_ids(state: GatewayState, body) -> None:
    vocab = state.tokenizer.vocab_size
    bad = [t for t in body.logit_bias_ids() if t >= vocab]
    if bad:
        raise InvalidRequest(
            f"logit_bias names token ids {bad} outside the vocabulary (size {vocab}).", param="logit_bias"
        )


@router.post("/chat/completions", responses=STREAMED)
@router.post("/chat/completions/", include_in_schema=False)  # served, not redirected (a 307)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, auth: CurrentKey, state: StateDep, quota: QuotaDep
):
    """Creates a model response for the given chat conversation."""
    adapter = await _check_model(state, auth, body.model, body.top_k)
    tier = resolve_tier(auth, body.service_tier, state.settings.tiers)
    options = body.sampling_options()  # refuse unsupported options before tokenizing
    body.check_messages()
    _check_token_ids(state, body)
    tool_plan = tools.plan(body.tools, body.tool_choice, parallel=body.parallel_tool_calls)
    if tool_plan is not None and (body.n or 1) > 1:
        raise InvalidRequest("n > 1 cannot be combined with tools: send n requests.", param="n")
    messages = [tools.render_history(m.as_template_input(), m.tool_calls) for m in body.messages]
    if tool_plan is not None:
        messages = tool_plan.render(messages)
        if tool_plan.forced:  # required / a named function: one call, constrained by its schema
            if options["structured"] is not None:
                raise InvalidRequest(
                    "A required or named tool_choice cannot be combined with an output constraint.",
                    param="tool_choice",
                )
            options["structured"] = tool_plan.structured()
    chars = sum(len(m["content"]) for m in messages)
    try:
        prompt_ids = await tokenize(state, state.tokenizer.encode_chat, messages, chars, "messages")
    except InvalidRequest:
        raise
    except Exception as exc:  # jinja errors, bad roles for this template…
        raise InvalidRequest(
            f"These messages cannot be rendered by the model's chat template: {exc}", param="messages"
        ) from exc
    ask = GenerationRequest(
        request_id=request.state.request_id,
        tier=tier,
        prompts=[prompt_ids],
        requested_max_tokens=body.requested_max_tokens(),
        sampling_options=options,
        traceparent=request.headers.get("traceparent"),
        adapter=adapter,
        disconnected=request.is_disconnected,
        structured_param=tool_plan.schema_param if tool_plan is not None and tool_plan.forced else None,
    )
    generation = await start(state, quota, auth, ask)
    return await _respond(generation, body, request, chat=True, tool_plan=tool_plan)


@router.post("/completions", responses=STREAMED)
@router.post("/completions/", include_in_schema=False)
async def completions(
    body: CompletionRequest, request: Request, auth: CurrentKey, state: StateDep, quota: QuotaDep
):
    """Creates a completion for the provided prompt (or for each of a list of prompts)."""
    adapter = await _check_model(state, auth, body.model, body.top_k)
    tier = resolve_tier(auth, body.service_tier, state.settings.tiers)
    options = body.sampling_options()
    _check_token_ids(state, body)
    prompts = body.prompts()
    limit = state.settings.max_prompts_per_request
    if len(prompts) > limit:
        raise InvalidRequest(
            f"The request has {len(prompts)} prompts; this server accepts at most {limit} in one request.",
            param="prompt",
        )
    prompt_ids = await completion_prompt_ids(state, prompts)
    echo = None
    if body.echo:
        echo = [
            (p if isinstance(p, str) else state.tokenizer.decode(ids), ids)
            for p, ids in zip(prompts, prompt_ids)
        ]
    ask = GenerationRequest(
        request_id=request.state.request_id,
        tier=tier,
        prompts=prompt_ids,
        requested_max_tokens=body.requested_max_tokens(),
        sampling_options=options,
        prompt_param="prompt",
        traceparent=request.headers.get("traceparent"),
        adapter=adapter,
        disconnected=request.is_disconnected,
    )
    generation = await start(state, quota, auth, ask)
    return await _respond(generation, body, request, chat=False, echo=echo)


Echo = list[tuple[str, list[int]]]  # (text, token ids) of each prompt of a request that asked for them back


async def _respond(
    generation: Generation,
    body,
    request: Request,
    *,
    chat: bool,
    echo: Echo | None = None,
    tool_plan: tools.ToolPlan | None = None,
):
    """echo: the prompts of a completions request that asked for them back; tool_plan: a chat
    request's tools (gateway/api/tools.py), whose calls are parsed from the output. Choice
    ``prompt_index * n + i`` is the i-th choice of that prompt (OpenAI's order)."""
    headers = generation.headers
    ids = dict(
        request_id=generation.request_id,
        created=generation.created,
        model=generation.model,
        tier=openai_tier(generation.tier, generation.state.settings.tiers),
    )
    if body.stream:
        return StreamingResponse(
            _stream(generation, _chunks(generation, body, chat, ids, echo, tool_plan)),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
            background=BackgroundTask(generation.after_response),  # however the stream ends
        )
    parts: dict[int, list[str]] = {}  # choice index -> its text pieces
    logprobs: dict[int, list] = {}
    reasons: dict[int, str | None] = {}
    failure: list[BaseException] = []

    async def collect(scope: anyio.CancelScope | None) -> None:
        try:
            async for result in generation:
                if result is not None:  # None: a keep-alive
                    parts.setdefault(result.index, []).append(result.text)
                    logprobs.setdefault(result.index, []).extend(result.logprobs or ())
                    if result.finish_reason is not None:
                        reasons[result.index] = result.finish_reason
        except Exception as exc:  # re-raised below, outside the task group (no ExceptionGroup)
            failure.append(exc)
        if scope is not None:
            scope.cancel()

    async def watch_disconnect(scope: anyio.CancelScope) -> None:
        while not await request.is_disconnected():
            await anyio.sleep(DISCONNECT_POLL_S)
        scope.cancel()  # the client left: stop relaying; close() cancels the request

    try:
        if generation.in_hand:  # the output came whole with the first results: no wait to watch
            await collect(None)
        else:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(collect, tasks.cancel_scope)
                tasks.start_soon(watch_disconnect, tasks.cancel_scope)
    finally:
        await generation.close(after_response=True)  # the quota is settled before the response
    try:
        response = _json(
            generation, body, chat, ids, headers, parts, logprobs, reasons, failure, echo, tool_plan
        )
    except BaseException:
        await generation.finish()
        raise
    response.background = BackgroundTask(generation.after_response)  # report and usage record
    return response


def _json(
    generation: Generation,
    body,
    chat: bool,
    ids: dict,
    headers: dict[str, str],
    parts: dict[int, list[str]],
    logprobs: dict[int, list],
    reasons: dict[int, str | None],
    failure: list[BaseException],
    echo: Echo | None,
    tool_plan: tools.ToolPlan | None,
) -> JSONResponse:
    """A non-streamed response from what the relay collected (raises the relay's failure)."""
    if failure:
        raise failure[0]
    if not generation.done:
        return JSONResponse({}, status_code=CLIENT_CLOSED_REQUEST)  # nobody is listening any more
    build = fmt.chat_completion if chat else fmt.text_completion
    indexes = sorted(parts)
    if not chat and body.ranks_choices:  # best_of: each prompt's n with the highest cumulative logprob
        by_prompt: dict[int, list[int]] = {}
        for i in indexes:
            by_prompt.setdefault(generation.prompt_index(i), []).append(i)
        indexes = [
            i
            for p in sorted(by_prompt)
            for i in sorted(by_prompt[p], key=lambda i: -sum(lp.logprob for lp in logprobs[i]))[: body.n or 1]
        ]
    choices = [
        _choice(
            generation,
            body,
            chat,
            echo and echo[generation.prompt_index(i)],
            i,
            "".join(parts[i]),
            reasons.get(i, generation.finish_reason),
            logprobs[i],
        )
        for i in indexes
    ]
    if tool_plan is not None:  # one choice (n > 1 is refused with tools)
        choices[0].text, choices[0].tool_calls = tool_plan.parse(choices[0].text)
    return JSONResponse(
        build(
            **ids,
            choices=choices,
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.completion_tokens,
            cached_tokens=generation.cached_tokens,
        ),
        headers=headers,
    )


def _choice(
    generation: Generation,
    body,
    chat: bool,
    echo: tuple[str, list[int]] | None,
    index: int,
    text: str,
    reason: str | None,
    logprobs: list,
) -> fmt.Choice:
    tokenizer = generation.state.tokenizer
    if chat:
        return fmt.Choice(text, reason, lp_fmt.chat_logprobs(tokenizer, logprobs) if body.logprobs else None)
    choice_logprobs = None
    if body.logprobs is not None:
        scored = list(generation.prompt_logprobs(index) or ()) if echo is not None else []
        choice_logprobs = lp_fmt.completion_logprobs(
            tokenizer, scored + logprobs, first_token_id=echo[1][0] if echo else None
        )
    return fmt.Choice(echo[0] + text if echo is not None else text, reason, choice_logprobs)


async def _stream(generation: Generation, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A streamed response's body: ``chunks``, then ``[DONE]`` once the request is settled. The
    report and the usage record (which waits for its batch's write, ``usage_write_linger_s``)
    follow the end of the response, as its background task (``Generation.after_response``)."""
    try:
        try:
            async for chunk in chunks:
                yield chunk
        except GatewayError as exc:
            yield fmt.sse_error(exc)
        await generation.close(after_response=True)
        yield fmt.SSE_DONE
    except BaseException:  # the client left, or the relay failed: all of it now
        await generation.end()
        raise


async def _chunks(
    generation: Generation,
    body,
    chat: bool,
    ids: dict,
    echo: Echo | None,
    tool_plan: tools.ToolPlan | None = None,
) -> AsyncIterator[bytes]:
    """The stream's SSE chunks, from the relay's results (raises the relay's GatewayError)."""
    chunk = partial(fmt.chat_chunk if chat else fmt.text_chunk, **ids, with_usage_field=body.include_usage)
    tokenizer = generation.state.tokenizer
    want_logprobs = bool(body.logprobs) if chat else body.logprobs is not None
    offsets: dict[int, int] = {}  # completions' text_offset per choice: characters streamed so far
    echoed: set[int] = set()

    def usage_now():
        return fmt.usage(generation.prompt_tokens, generation.completion_tokens, generation.cached_tokens)

    def completion_logprobs(index: int, logprobs, first_token_id=None):
        shaped = lp_fmt.completion_logprobs(
            tokenizer, logprobs, text_offset=offsets.get(index, 0), first_token_id=first_token_id
        )
        offsets[index] = offsets.get(index, 0) + sum(len(t) for t in shaped["tokens"])
        return shaped

    if chat:
        for index in range(body.n or 1):
            yield fmt.sse(chunk(delta={"role": "assistant", "content": ""}, index=index))
    tool_output: list[str] = []  # with tools: the whole output, sent as one piece at the end
    async for result in generation:
        if result is None:
            yield fmt.SSE_KEEPALIVE  # a comment line: clients and proxies see the stream alive
            continue
        if tool_plan is not None:  # one choice (n > 1 is refused with tools)
            tool_output.append(result.text)
            if result.finish_reason is None:
                continue
            yield fmt.sse(chunk(delta=tools.stream_delta(tool_plan, "".join(tool_output))))
            result = replace(
                result, text="", finish_reason="tool_calls" if tool_plan.called else result.finish_reason
            )
        index = result.index
        if echo is not None and index not in echoed:  # the prompt first, as its own chunk
            echoed.add(index)
            text, prompt_ids = echo[generation.prompt_index(index)]
            scored = list(generation.prompt_logprobs(index) or ()) if want_logprobs else None
            yield fmt.sse(
                chunk(
                    text=text,
                    index=index,
                    logprobs=None if scored is None else completion_logprobs(index, scored, prompt_ids[0]),
                )
            )
        reason = result.finish_reason  # this choice's end (the request's with its last choice)
        if not result.text and reason is None and not (want_logprobs and result.logprobs):
            continue  # e.g. a token that completes no character yet
        content = {"content": result.text} if result.text or reason is None else {}
        per_chunk_usage = usage_now() if body.continuous_usage else None
        logprobs = None
        if want_logprobs:
            logprobs = (
                lp_fmt.chat_logprobs(tokenizer, list(result.logprobs or ()))
                if chat
                else completion_logprobs(index, list(result.logprobs or ()))
            )
        yield fmt.sse(
            chunk(delta=content, reason=reason, usage_body=per_chunk_usage, logprobs=logprobs, index=index)
            if chat
            else chunk(
                text=result.text,
                reason=reason,
                usage_body=per_chunk_usage,
                logprobs=logprobs,
                index=index,
            )
        )
    if body.include_usage:
        yield fmt.sse(
            chunk(delta=None, usage_body=usage_now()) if chat else chunk(text=None, usage_body=usage_now())
        )
