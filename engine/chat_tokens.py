"""Token ids of a rendered chat prompt, piece by piece, with recent pieces remembered.

A fast tokenizer (the ``tokenizers`` library) first splits its input at its added tokens and then
tokenizes each stretch of text between them on its own: the added vocabulary's split comes before
normalization and pre-tokenization, and those run split by split. A rendered chat prompt's ids are
therefore its pieces' ids put together, and its pieces repeat: the template's role headers and
default system prompt in every request, a conversation's earlier turns in each of its later
requests. ``PieceCache`` remembers the ids of recent pieces (least recently used out, bounded in
characters), so a request pays only for the text that is new to this process.

Only where tokenizing the pieces on their own is exactly what tokenizing the whole does
(``eligible``): a BPE model, no normalizer, a pre-tokenizer made of byte-level and regex splits
that prepend no space (GPT-2, Llama 3, Qwen 2 and SmolLM2 tokenizers), and added tokens matched as
written (none strips the whitespace beside it or matches whole words only, all matched on the
raw text or all on the normalized one). Any other tokenizer (a SentencePiece-style metaspace that
prepends a space to the first piece only, a normalizer) tokenizes the whole rendering, as without
the cache.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from array import array
from collections import OrderedDict
from typing import Any

MAX_CHARS = 1 << 20  # the text a tokenizer's cache holds, all pieces together (about 5 MB with ids)
MAX_PIECE_CHARS = 1 << 16  # a longer piece is tokenized each time, not kept

_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> (its size, PieceCache | None)
_CACHES_LOCK = threading.Lock()


def eligible(backend: Any) -> bool:
    """Whether tokenizing the text between ``backend``'s added tokens piece by piece gives the
    ids of the whole (see the module's docstring)."""
    if backend.encode_special_tokens:  # added tokens' text is read as text: no split at them
        return False
    spec = json.loads(backend.to_str())
    if spec.get("normalizer") is not None or (spec.get("model") or {}).get("type") != "BPE":
        return False
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or not all(_context_free(step) for step in steps):
        return False
    added = spec.get("added_tokens", [])
    # The tokenizer splits at the added tokens matched on the raw text first, then at those matched
    # on the normalized text: one kind only (no normalizer: the same text) is one leftmost-longest pass.
    if len({bool(token.get("normalized")) for token in added}) > 1:
        return False
    return not any(token.get("lstrip") or token.get("rstrip") or token.get("single_word") for token in added)


def _context_free(step: dict) -> bool:
    """A pre-tokenizer step that treats every split alike, wherever it is in the input."""
    if step.get("type") == "ByteLevel":
        return not step.get("add_prefix_space")
    return step.get("type") == "Split"


class PieceCache:
    """The ids of recent pieces of one tokenizer's inputs; safe to share between threads."""

    def __init__(self, backend: Any, *, max_chars: int = MAX_CHARS) -> None:
        self.backend, self.max_chars = backend, max_chars
        tokens = backend.get_added_tokens_decoder().items()
        self.added = {token.content: int(i) for i, token in tokens}
        # The longest first: at one position the tokenizer takes the longest added token there.
        names = sorted(self.added, key=len, reverse=True)
        self.split = re.compile("(" + "|".join(re.escape(name) for name in names) + ")") if names else None
        self._ids: OrderedDict[str, array] = OrderedDict()
        self.chars = 0  # of the pieces held
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def encode(self, text: str) -> list[int]:
        """``backend.encode(text, add_special_tokens=False).ids``, from remembered pieces where it can."""
        pieces = self.split.split(text) if self.split is not None else [text]
        ids: list[int] = []
        # re.split with one group alternates text, added token, text, ...: odd indexes are tokens.
        for i, piece in enumerate(pieces):
            if i % 2:
                ids.append(self.added[piece])
            elif piece:
                ids.extend(self._piece(piece))
        return ids

    def _piece(self, piece: str) -> array:
        with self._lock:
            found = self._ids.get(piece)
            if found is not None:
                self._ids.move_to_end(piece)
                self.hits += 1
                return found
            self.misses += 1
        ids = array("i", self.backend.encode(piece, add_special_tokens=False).ids)
        if len(piece) <= MAX_PIECE_CHARS:
            with self._lock:
                if piece not in self._ids:
                    self._ids[piece] = ids
                    self.chars += len(piece)
                    while self.chars > self.max_chars:
                        old, _ = self._ids.popitem(last=False)
                        self.chars -= len(old)
        return ids


def piece_cache(backend: Any) -> PieceCache | None:
    """The backend's PieceCache, made on first use and again after a token is added to it; None
    where it is not ``eligible``."""
    size = backend.get_vocab_size(with_added_tokens=True)
    cached = _CACHES.get(backend)
    if cached is not None and cached[0] == size:
        return cached[1]
    with _CACHES_LOCK:
        cached = _CACHES.get(backend)
        if cached is None or cached[0] != size:
            cached = _CACHES[backend] = (size, PieceCache(backend) if eligible(backend) else None)
        return cached[1]


def encode_rendered(backend: Any, text: str) -> list[int]:
    """A rendered chat prompt's ids, as ``backend.encode(text, add_special_tokens=False)`` gives them."""
    cache = piece_cache(backend)
    if cache is None:
        return list(backend.encode(text, add_special_tokens=False).ids)
    return cache.encode(text)
