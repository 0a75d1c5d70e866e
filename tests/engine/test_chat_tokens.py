"""engine/chat_tokens.py: a rendered chat prompt tokenized piece by piece, from remembered pieces,
gives exactly the ids of tokenizing it whole, on SmolLM2's real tokenizer and on a Llama 3 style
one; tokenizers where that need not hold are tokenized whole."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer

from engine import assets
from engine.chat_tokens import PieceCache, eligible, encode_rendered, piece_cache

# Llama 3's pre-tokenizer split (its tokenizer.json), before a byte-level step without a regex.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# A space before the first piece only.
METASPACE = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}


@pytest.fixture(scope="module")
def smollm2():
    return assets.load_tokenizer("smollm2")


def _variant(tokenizer, edit) -> Tokenizer:
    """SmolLM2's backend with its tokenizer.json edited by ``edit``."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    edit(spec)
    return Tokenizer.from_str(json.dumps(spec))


def _llama3_style(spec: dict) -> None:
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ],
    }


def _renderings(tokenizer, count: int, seed: int) -> list[str]:
    """Random text with the tokenizer's added tokens in it, beside spaces, newlines, digits,
    contractions and characters of several scripts (what splits and merges depend on)."""
    specials = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
    alphabet = list("ab cd\n\t  ÉéßΩ漢字🙂0123456789.,!?-_") + ["'s", "'ll", "  \n", "\r\n", "    "]
    alphabet += specials + [" " + s for s in specials] + [s + " " for s in specials] + ["<|im", "end|>"]
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(count)]


def _all_normalized(spec: dict) -> None:
    for token in spec["added_tokens"]:
        token["normalized"] = True


@pytest.mark.parametrize("kind", ["smollm2", "llama3-style", "normalized-tokens"])
def test_pieces_give_the_ids_of_the_whole(smollm2, kind):
    edits = {"llama3-style": _llama3_style, "normalized-tokens": _all_normalized}
    backend = smollm2.backend_tokenizer if kind == "smollm2" else _variant(smollm2, edits[kind])
    assert eligible(backend)
    cache = PieceCache(backend)
    for text in _renderings(backend, 1500, seed=len(kind)):
        whole = backend.encode(text, add_special_tokens=False).ids
        assert cache.encode(text) == whole, text
        assert cache.encode(text) == whole, text  # again, from memory
    assert cache.hits > 0 and cache.misses > 0


def test_a_chat_prompt_is_tokenized_as_the_template_does_and_its_pieces_remembered(smollm2):
    turns = [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "And goodbye?"},
    ]
    cache = piece_cache(smollm2.backend_tokenizer)
    assert cache is not None
    for n in (2, 4):  # a conversation's next request repeats its earlier turns
        expected = smollm2.apply_chat_template(turns[:n], add_generation_prompt=True, tokenize=True)
        expected = expected["input_ids"] if not isinstance(expected, list) else expected
        hits = cache.hits
        assert assets.encode_chat(smollm2, turns[:n]) == list(expected)
        assert assets.encode_chat(smollm2, turns[:n]) == list(expected)
        assert cache.hits > hits


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda s: s.update(normalizer={"type": "NFKC"}), id="normalizer"),
        pytest.param(lambda s: s.update(pre_tokenizer=METASPACE), id="metaspace"),
        pytest.param(lambda s: s["pre_tokenizer"].update(add_prefix_space=True), id="prefix-space"),
        pytest.param(lambda s: s["added_tokens"][1].update(rstrip=True), id="rstrip-token"),
        pytest.param(lambda s: s["added_tokens"][1].update(lstrip=True), id="lstrip-token"),
        pytest.param(lambda s: s["added_tokens"][1].update(normalized=True), id="mixed-normalized"),
    ],
)
def test_other_tokenizers_are_tokenized_whole(smollm2, edit):
    backend = _variant(smollm2, edit)
    assert not eligible(backend) and piece_cache(backend) is None
    for text in _renderings(backend, 50, seed=7):
        assert encode_rendered(backend, text) == backend.encode(text, add_special_tokens=False).ids


def test_special_tokens_read_as_text_are_not_split_at(smollm2):
    backend = _variant(smollm2, lambda s: None)
    backend.encode_special_tokens = True
    assert not eligible(backend)


def test_the_cache_is_bounded_and_keeps_what_is_used(smollm2):
    cache = PieceCache(smollm2.backend_tokenizer, max_chars=200)
    kept = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    for i in range(100):
        cache.encode(kept + f"<|im_start|>user\nquestion number {i}<|im_end|>")
        assert cache.chars <= 200
    misses = cache.misses
    cache.encode(kept)
    assert cache.misses == misses  # used by every request: never the least recently used


def test_a_token_added_later_is_split_at(smollm2):
    backend = _variant(smollm2, lambda s: None)
    before = encode_rendered(backend, "hi <extra_tool> there")
    backend.add_special_tokens(["<extra_tool>"])
    after = encode_rendered(backend, "hi <extra_tool> there")
    assert after != before
    assert after == backend.encode("hi <extra_tool> there", add_special_tokens=False).ids
    assert backend.token_to_id("<extra_tool>") in after
