"""OpenAI-compatible request bodies (chat and completions). A field neither OpenAI's schema for the
endpoint nor our extensions name is a 400 (OpenAI's "Unrecognized request argument supplied"), and
one we know but do not honour is a 400 naming it: nothing a client sends is silently ignored, unless
it cannot change the output (``user``, ``metadata``; docs/api.md lists them).

Every integer is bounded (a JSON number no 64-bit field can hold is a 422, never an overflow
further on) and strict (``true`` is not 1); every string must be encodable as UTF-8 (a lone
surrogate such as ``"\ud800"`` is a 400); ``null`` means the default wherever OpenAI's spec
allows it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict

from gateway.api.errors import InvalidRequest
from gateway.api.structured import structured_spec

MAX_STOP_STRINGS = 4  # OpenAI's limit
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when the request names none
GREEDY_BELOW = 1e-5  # a temperature below this samples greedily (dividing logits by it would overflow)
INT32_MAX, INT64_MIN, INT64_MAX = 2**31 - 1, -(2**63), 2**63 - 1
TOKEN_ID_MAX = INT32_MAX  # the model's vocabulary bounds it further (checked by the route)
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5  # OpenAI's limits: chat top_logprobs, completions logprobs
MAX_N = 128  # choices of one request (n, best_of)


def _utf8(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text (it holds a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_utf8)]
Int = Annotated[int, Strict()]  # no booleans, no floats, no numeric strings
Float = Annotated[float, Strict()]  # ints are floats; booleans are not
TokenId = Annotated[int, Strict(), Field(ge=0, le=TOKEN_ID_MAX)]


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # with include_usage: usage on every chunk (vLLM's extension)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: Text | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: Any = None  # an assistant's earlier calls (checked by gateway/api/tools.py)
    tool_call_id: Text | None = None  # a tool message's answer to one of them

    def check(self, index: int, previous: ChatMessage | None) -> None:
        """400 for what OpenAI refuses in messages[index], naming the field (messages[1].content):
        content is required but on an assistant message with tool_calls; a tool message answers a
        call (tool_call_id) of the assistant message before it."""
        at = f"messages[{index}]"
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            what = "Missing required parameter" if "content" not in self.model_fields_set else "Invalid null"
            hint = " (an assistant message needs content or tool_calls)" if self.role == "assistant" else ""
            raise InvalidRequest(f"{what}: '{at}.content'{hint}.", param=f"{at}.content")
        if isinstance(self.content, list):
            if not self.content:
                raise InvalidRequest(
                    f"Invalid value for '{at}.content': an empty array of content parts.",
                    param=f"{at}.content",
                )
            for j, part in enumerate(self.content):
                if part.type != "text":
                    raise InvalidRequest(
                        f"Only text content parts are supported, got {part.type!r}.",
                        param=f"{at}.content[{j}].type",
                    )
                if part.text is None:
                    raise InvalidRequest(
                        f"Missing required parameter: '{at}.content[{j}].text'.",
                        param=f"{at}.content[{j}].text",
                    )
        if self.tool_calls is not None and self.role != "assistant":
            raise InvalidRequest(
                f"Only assistant messages carry tool_calls ('{at}' is a {self.role} message).",
                param=f"{at}.tool_calls",
            )
        if self.role != "tool":
            return
        if not self.tool_call_id:
            raise InvalidRequest(
                f"Missing required parameter: '{at}.tool_call_id'.", param=f"{at}.tool_call_id"
            )
        if previous is None or not (previous.role == "tool" or previous.tool_calls):
            raise InvalidRequest(
                "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'.",
                param=f"{at}.role",
            )

    def as_template_input(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise InvalidRequest("Only text content parts are supported.", param="messages")
            content = "".join(part.text or "" for part in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class _GenerationRequest(BaseModel):
    # Unknown fields are kept (model_extra) so that the route refuses them with a 400 naming one;
    # the OpenAPI document says they are not allowed.
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})

    model: str
    max_tokens: Int | None = Field(None, ge=1, le=INT32_MAX)  # and <= the context (checked with the prompt)
    temperature: Float | None = Field(None, ge=0, le=2)
    top_p: Float | None = Field(None, gt=0, le=1)
    top_k: Int | None = Field(None, ge=0, le=INT32_MAX)  # extension; <= the vocabulary (checked by the route)
    n: Int | None = Field(None, ge=1, le=MAX_N)
    stop: Text | list[Text] | None = None
    seed: Int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    ignore_eos: bool | None = False  # extension
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    service_tier: Text | None = None
    user: Text | None = None  # no effect (tenants are known by their key)
    safety_identifier: Text | None = None  # OpenAI's successor of user: no effect
    prompt_cache_key: Text | None = None  # no effect (the prefix cache needs no key)
    # Ranges are checked by the engine's SamplingParams (a 400 naming the parameter), logit_bias
    # keys against the vocabulary by the route.
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    repetition_penalty: Float | None = None  # extension (vLLM's)
    logit_bias: dict[str, Float] | None = None
    min_tokens: Int | None = Field(None, ge=0, le=INT32_MAX)  # extension (vLLM's)
    tools: list[Any] | None = None  # chat only (gateway/api/tools.py); a 400 on completions
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = (
        None  # text | json_object | json_schema (gateway/api/structured.py)
    )
    guided_json: dict[str, Any] | Text | None = (
        None  # vLLM's extensions: a JSON schema, a regex, an EBNF grammar
    )
    guided_regex: Text | None = None
    guided_grammar: Text | None = None
    guided_choice: list[Text] | None = Field(None, max_length=1024)
    # Accepted so that using them is a clear 400, not silently ignored.
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[Any] | None = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    store: bool | None = None  # completions are never stored: true is refused, metadata goes unused

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def _refuse_unknown(self) -> None:
        """400 for a field this endpoint does not know (OpenAI's message), naming the first one."""
        for name in self.model_extra or {}:
            raise InvalidRequest(
                f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter"
            )

    def _refuse_unsupported(self) -> None:
        self._refuse_unknown()
        chat = isinstance(self, ChatCompletionRequest)
        unsupported = {
            "tools": self.tools is not None and not chat,  # chat: gateway/api/tools.py
            "tool_choice": self.tool_choice is not None and not chat,
            "parallel_tool_calls": self.parallel_tool_calls is not None and not chat,
            "functions": bool(self.functions),
            "function_call": self.function_call not in (None, "none"),
            "audio": self.audio is not None,
            "modalities": self.modalities not in (None, ["text"]),
            "prediction": self.prediction is not None,
            "reasoning_effort": self.reasoning_effort is not None,
            "web_search_options": self.web_search_options is not None,
            "store": bool(self.store),
        }
        for name, used in unsupported.items():
            if used:
                raise InvalidRequest(
                    f"'{name}' is not supported by this server.", param=name, code="unsupported_parameter"
                )

    def sampling_options(self) -> dict[str, Any]:
        """The engine's SamplingParams fields this request sets (all but max_tokens, which the gateway
        resolves against the context); 400 for an option this server cannot honour."""
        self._refuse_unsupported()
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest(
                "stream_options is only allowed when stream is true.", param="stream_options"
            )
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP_STRINGS or any(not s for s in stop):
            raise InvalidRequest(f"stop must be up to {MAX_STOP_STRINGS} non-empty strings.", param="stop")
        temperature = DEFAULT_TEMPERATURE if self.temperature is None else self.temperature
        options = {
            "temperature": 0.0 if temperature < GREEDY_BELOW else temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": self.top_k or 0,
            "seed": self.seed,
            "stop": tuple(stop),
            "ignore_eos": bool(self.ignore_eos),
            "structured": structured_spec(
                response_format=self.response_format,
                guided_json=self.guided_json,
                guided_regex=self.guided_regex,
                guided_grammar=self.guided_grammar,
                guided_choice=self.guided_choice,
            ),
        }
        penalties = {
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "min_tokens": self.min_tokens,
        }
        options |= {k: v for k, v in penalties.items() if v is not None}
        if self.n is not None:
            options["n"] = self.n
        if self.logit_bias:
            options["logit_bias"] = _logit_bias(self.logit_bias)
        return options | self._logprob_options()

    def _logprob_options(self) -> dict[str, Any]:
        return {}

    def logit_bias_ids(self) -> list[int]:
        return [t for t, _ in _logit_bias(self.logit_bias)] if self.logit_bias else []

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk: continuous_usage_stats together with include_usage (vLLM's rule;
        alone it does nothing)."""
        options = self.stream_options
        return bool(options and options.include_usage and options.continuous_usage_stats)


def _logit_bias(bias: dict[str, float]) -> tuple[tuple[int, float], ...]:
    pairs = []
    for token, value in bias.items():
        # ASCII digits only: str.isdigit() takes " 1", "１" (full width) and "²", and int() strips
        if not (token.isascii() and token.isdigit()) or int(token) > TOKEN_ID_MAX:
            raise InvalidRequest(f"logit_bias keys must be token ids, got {token!r}.", param="logit_bias")
        if not -100 <= value <= 100:
            raise InvalidRequest(
                f"logit_bias values must be in [-100, 100], got {value!r}.", param="logit_bias"
            )
        pairs.append((int(token), value))
    return tuple(pairs)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool | None = None
    top_logprobs: Int | None = None
    metadata: dict[str, Any] | None = None  # no effect: completions are never stored
    # Fields of /v1/completions that chat has not: their defaults are accepted, anything else is a 400.
    best_of: Int | None = None
    echo: bool | None = None
    suffix: Text | None = None

    def _refuse_unsupported(self) -> None:
        super()._refuse_unsupported()
        completions_only = {
            "best_of": self.best_of not in (None, 1),
            "echo": bool(self.echo),
            "suffix": bool(self.suffix),
        }
        for name, used in completions_only.items():
            if used:
                raise InvalidRequest(
                    f"'{name}' is not supported on /v1/chat/completions (it is a /v1/completions parameter).",
                    param=name,
                    code="unsupported_parameter",
                )

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def check_messages(self) -> None:
        """400 naming the first message OpenAI would refuse (ChatMessage.check)."""
        for i, message in enumerate(self.messages):
            message.check(i, self.messages[i - 1] if i else None)

    def _logprob_options(self) -> dict[str, Any]:
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise InvalidRequest("top_logprobs needs logprobs set to true.", param="top_logprobs")
            if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
                raise InvalidRequest(
                    f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}].", param="top_logprobs"
                )
        return {"logprobs": self.top_logprobs or 0} if self.logprobs else {}


class CompletionRequest(_GenerationRequest):
    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    max_tokens: Int | None = Field(
        None, ge=0, le=INT32_MAX
    )  # 0: score the prompt only (with echo + logprobs)
    echo: bool | None = False
    logprobs: Int | None = None
    best_of: Int | None = None
    suffix: Text | None = None

    def _logprob_options(self) -> dict[str, Any]:
        if self.suffix:
            raise InvalidRequest(
                "suffix is not supported: this model has no fill-in-the-middle.",
                param="suffix",
                code="unsupported_parameter",
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise InvalidRequest(f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}].", param="logprobs")
        options: dict[str, Any] = {}
        if self.logprobs is not None:
            options["logprobs"] = self.logprobs
            if self.echo:
                options["prompt_logprobs"] = self.logprobs
        if self.max_tokens == 0:  # the engine scores the prompt and generates nothing
            options.setdefault("prompt_logprobs", 0)
        n = self.n or 1
        if self.best_of is not None and self.best_of != n:
            if not n <= self.best_of <= MAX_N:
                raise InvalidRequest(f"best_of must be in [n, {MAX_N}] (n is {n}).", param="best_of")
            if self.stream:
                raise InvalidRequest("best_of cannot be streamed.", param="best_of")
            options["n"] = self.best_of  # the engine makes best_of choices; the route returns the n best
            options.setdefault("logprobs", 0)  # their cumulative logprob ranks them
        return options

    @property
    def ranks_choices(self) -> bool:
        """Does the route pick the n best of best_of choices?"""
        return self.best_of is not None and self.best_of != (self.n or 1)

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts: a string or token ids is one; a list of either, one each."""
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) == 0:
                raise InvalidRequest("prompt must not be empty.", param="prompt")
            if isinstance(prompt[0], (str, list)):
                return list(prompt)
        return [prompt]
