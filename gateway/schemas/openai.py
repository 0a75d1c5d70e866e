"""OpenAI-compatible request bodies (chat and completions). Unknown OpenAI fields are ignored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import InvalidRequest
from gateway.messages import SamplingSpec


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # usage on every chunk (vLLM's extension)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def as_template_input(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise InvalidRequest("Only text content parts are supported.", param="messages")
            content = "".join(part.text or "" for part in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # extension
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False  # extension
    stream: bool = False
    stream_options: StreamOptions | None = None
    service_tier: str | None = None
    user: str | None = None
    # Accepted so that using them is a clear 400, not silently ignored.
    logprobs: bool | int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def _refuse_unsupported(self) -> None:
        unsupported = {
            "logprobs": bool(self.logprobs),
            "presence_penalty": bool(self.presence_penalty),
            "frequency_penalty": bool(self.frequency_penalty),
            "tools": bool(self.tools),
            "response_format": bool(self.response_format) and self.response_format.get("type") != "text",
        }
        for name, used in unsupported.items():
            if used:
                raise InvalidRequest(f"'{name}' is not supported by this server.", param=name,
                                     code="unsupported_parameter")

    def sampling(self, *, max_tokens: int) -> SamplingSpec:
        self._refuse_unsupported()
        if self.n != 1:
            raise InvalidRequest("Only n=1 is supported.", param="n", code="unsupported_value")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("stream_options is only allowed when stream is true.", param="stream_options")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 4 or any(not s for s in stop):
            raise InvalidRequest("stop must be up to 4 non-empty strings.", param="stop")
        return SamplingSpec(
            max_tokens=max_tokens, temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0, seed=self.seed,
            stop=tuple(stop), ignore_eos=self.ignore_eos,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and (self.stream_options.include_usage
                                             or self.stream_options.continuous_usage_stats))

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False

    def single_prompt(self) -> str | list[int]:
        if self.echo:
            raise InvalidRequest("echo is not supported.", param="echo")
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) == 0:
                raise InvalidRequest("prompt must not be empty.", param="prompt")
            if isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise InvalidRequest("Only one prompt per request is supported.", param="prompt")
                return prompt[0]
        return prompt
