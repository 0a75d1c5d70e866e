"""Prompt tokenization in the gateway: the served model's tokenizer and the engine's one rule.

The tokenizer and the rule (text and chat messages to ids) come from `engine.assets`, the module
the engine's loader uses too (torch-free: no weights are loaded), so a prompt becomes the same
ids here as offline. Random-weight "dummy" models have no tokenizer: for them a byte tokenizer
lets tests and benchmarks send text.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from engine import assets


class PromptTokenizer(Protocol):
    vocab_size: int

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]: ...
    def encode_prompt(self, prompt: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def token_bytes(self, token_id: int) -> bytes: ...


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character standing for each byte, reversed."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in visible:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_DECODER = _byte_decoder()


class HFPromptTokenizer:
    """A transformers tokenizer under `engine.assets`' tokenization rule."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)  # token ids are below this (added tokens included)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        return assets.encode_chat(self.tokenizer, messages)

    def encode_prompt(self, prompt: str) -> list[int]:
        return assets.encode_prompt(self.tokenizer, prompt)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one tokenizer per gateway, kept for its life
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for: exact for byte-level BPE, else its decoded text's UTF-8."""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece and token_id not in self._special and all(c in _BYTE_DECODER for c in piece):
            return bytes(_BYTE_DECODER[c] for c in piece)
        return self.tokenizer.decode([token_id]).encode("utf-8")

    @functools.cached_property
    def _special(self) -> frozenset[int]:
        return frozenset(self.tokenizer.all_special_ids)


class BytePromptTokenizer:
    """For random-weight models: one token per UTF-8 byte, offset past the special ids."""

    OFFSET = 3

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode_prompt(self, prompt: str) -> list[int]:
        return [(b + self.OFFSET) % self.vocab_size for b in prompt.encode("utf-8")]

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        text = "".join(f"{m.get('role', 'user')}: {_content_text(m.get('content'))}\n" for m in messages)
        return self.encode_prompt(text + "assistant: ")

    def decode(self, ids: list[int]) -> str:
        return "".join(f" t{t}" for t in ids)  # as the worker shows a tokenizer-less model's output

    def token_bytes(self, token_id: int) -> bytes:
        return f" t{token_id}".encode()


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def load_prompt_tokenizer(model: str, *, dummy_config: dict[str, Any] | None = None) -> PromptTokenizer:
    """The tokenizer for a model spec as the engine reads it ("smollm2", "dummy", a folder, a .gguf)."""
    tokenizer = assets.load_tokenizer(model)
    if tokenizer is not None:
        return HFPromptTokenizer(tokenizer)
    if model == assets.DUMMY:
        return BytePromptTokenizer(int((dummy_config or {}).get("vocab_size", 49152)))
    raise FileNotFoundError(
        f"model {model!r} has no tokenizer (tokenizer.json): the gateway needs one to tokenize prompts"
    )
