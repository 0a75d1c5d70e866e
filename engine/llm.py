"""The offline API: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from engine import assets
from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import InvalidRequestError
from engine.lora.request import LoRARequest
from engine.request import SamplingParams, TokenLogprob

Prompt = str | list[int] | list[dict[str, Any]]  # text, token ids, or chat messages
LoRA = str | LoRARequest | None  # a PEFT adapter folder, or a name and folder


@dataclass
class Completion:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None  # one per output token, with params.logprobs
    prompt_logprobs: list[TokenLogprob | None] | None = None  # with params.prompt_logprobs (first: None)
    index: int = 0  # the choice (SamplingParams.n)
    choices: list[Completion] | None = None  # n > 1: every choice, by index (the fields above are choice 0's)


class LLM:
    """Runs batches of prompts to completion on one Engine."""

    def __init__(self, model: str = "smollm2", config: EngineConfig | None = None, **overrides: Any):
        overrides.setdefault("incremental_text", False)  # text is decoded once, at the end
        self.engine = Engine(config, model=model, **overrides) if config else Engine(model=model, **overrides)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids for a prompt: ids pass through, text and chat messages follow the rule of
        `engine.assets` (the gateway's too)."""
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(cast(list[int], prompt))
        tok = self.engine.tokenizer
        if tok is None:
            raise InvalidRequestError("this model has no tokenizer: pass token ids", param="prompt")
        if isinstance(prompt, str):
            return assets.encode_prompt(tok, prompt)
        if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            messages = cast(list[dict[str, Any]], prompt)
            if not messages or not all("role" in m and "content" in m for m in messages):
                raise InvalidRequestError("chat messages need a role and content each", param="messages")
            return assets.encode_chat(tok, messages)
        raise InvalidRequestError(
            "a prompt is text, a list of token ids or a list of chat messages", param="prompt"
        )

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        params: SamplingParams | list[SamplingParams] | None = None,
        *,
        lora: LoRA | list[LoRA] = None,
        use_tqdm: bool = False,
        on_finish: Callable[[int, Completion], None] | None = None,
    ) -> list[Completion]:
        """Generate for every prompt; results in input order. Every prompt (and adapter) is
        validated before any is scheduled. `lora`: a PEFT adapter folder or a LoRARequest for
        every prompt, or a list with one per prompt (None: the base model).
        `on_finish(index, completion)` is called as each one finishes."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and all(isinstance(x, (int, dict)) for x in prompts)
        ):
            prompts = [cast(Prompt, prompts)]
        prompts = cast(list[Prompt], prompts)
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequestError("give one SamplingParams, or one per prompt", param="params")
        loras = list(lora) if isinstance(lora, (list, tuple)) else [lora] * len(prompts)
        if len(loras) != len(prompts):
            raise InvalidRequestError("give one lora, or one per prompt", param="lora")
        encoded = [self.encode(p) for p in prompts]
        for ids, p in zip(encoded, plist):
            self.engine.validate(ids, p)
        for adapter in dict.fromkeys(x for x in loras if x is not None):
            self.engine.check_lora(adapter)
        ids_by_req = {}
        for i, (ids, p) in enumerate(zip(encoded, plist)):
            rid = f"llm-{uuid.uuid4().hex[:12]}-{i}"
            ids_by_req[rid] = i
            self.engine.add_request(rid, ids, p, lora=loras[i])
        return self._run(ids_by_req, encoded, _progress(len(prompts), use_tqdm), on_finish)

    def _run(
        self,
        index: dict[str, int],
        encoded: list[list[int]],
        bar: Any,
        on_finish: Callable[[int, Completion], None] | None,
    ) -> list[Completion]:
        tokens: dict[tuple[str, int], list[int]] = {}  # (request, choice) ->
        logprobs: dict[tuple[str, int], list[TokenLogprob]] = {}
        prompt_logprobs: dict[str, list[TokenLogprob | None]] = {}
        choices: dict[str, dict[int, Completion]] = {rid: {} for rid in index}
        results: list[Completion | None] = [None] * len(index)
        tok = self.engine.tokenizer
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    key = (out.request_id, out.index)
                    tokens.setdefault(key, []).extend(out.new_token_ids)
                    if out.logprobs is not None:
                        logprobs.setdefault(key, []).extend(out.logprobs)
                    if out.prompt_logprobs is not None:
                        prompt_logprobs[out.request_id] = out.prompt_logprobs
                    if out.finished:
                        i = index[out.request_id]
                        ids = tokens.get(key, [])
                        text = tok.decode(ids, skip_special_tokens=True) if tok is not None else ""
                        choices[out.request_id][out.index] = Completion(
                            out.request_id,
                            encoded[i],
                            ids,
                            text,
                            out.finish_reason,
                            logprobs.get(key),
                            prompt_logprobs.get(out.request_id),
                            out.index,
                        )
                    if out.done:
                        i = index[out.request_id]
                        done = [choices[out.request_id][j] for j in sorted(choices[out.request_id])]
                        completion = replace(done[0], choices=done if len(done) > 1 else None)
                        results[i] = completion
                        if on_finish:
                            on_finish(i, completion)
                        bar.update(1)
        finally:
            bar.close()
            for rid in index:  # an exception (or Ctrl-C) must not leave requests holding blocks
                self.engine.abort(rid)
        return results  # type: ignore[return-value]


class _NoBar:
    def update(self, n: int) -> None: ...
    def close(self) -> None: ...


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="generate")
