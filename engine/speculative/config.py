"""`EngineConfig.speculative_config`, checked: vLLM's key names where they exist, plus when to
speculate (min_priority, max_decoding_seqs). Plain Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model")
SELF = "self"  # draft_model's `model`: the target's own weights (with `quantization`: their INT8 copy)
NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max", "max_num_speculative_tokens")
GROWTH = 4  # ngram: max_num_speculative_tokens when unset, times num_speculative_tokens
DRAFT_MODEL_KEYS = ("model", "quantization")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4  # k: drafted tokens verified per speculating sequence and step
    # ngram: a sequence whose drafts were all kept may draft twice as many next step, up to this
    # (None: GROWTH * k; k: a fixed draft length); after a rejection it drafts k again
    max_num_speculative_tokens: int | None = None
    prompt_lookup_min: int = 2  # ngram: shortest suffix n-gram looked up in the sequence's own tokens
    prompt_lookup_max: int = 4  # ngram: longest (tried first)
    # draft_model: the draft ("smollm2", a folder, or "self": the target's weights), sharing the
    # target's vocabulary, and its weights' quantization (None: the engine's dtype, or "int8")
    model: str | None = None
    quantization: str | None = None
    # When to speculate: only sequences of priority >= min_priority (with the gateway's default tiers
    # priority=3, standard=2, batch=1: the interactive tiers; LLM requests have priority 0), and only
    # while at most max_decoding_seqs sequences run (a larger batch is compute-bound: no gain).
    min_priority: int = 2
    max_decoding_seqs: int = 8
    # and only while the sequence's drafts pay: a sequence whose running share of drafts kept falls
    # below min_acceptance (0: never) drafts no more, but for one probe after each probe_interval
    # decode steps without drafts (its output may start copying again)
    min_acceptance: float = 0.2
    probe_interval: int = 8

    @property
    def max_draft_tokens(self) -> int:
        """The most drafts a sequence takes in a step: max_num_speculative_tokens (ngram; unset:
        GROWTH * k), k for a draft model."""
        k = self.num_speculative_tokens
        if self.method != "ngram":
            return k
        return GROWTH * k if self.max_num_speculative_tokens is None else self.max_num_speculative_tokens


def parse_speculative_config(value: Any) -> SpeculativeConfig | None:
    """The config dict (or None: off) as a SpeculativeConfig; ValueError naming the bad key."""
    if value is None:
        return None
    if isinstance(value, SpeculativeConfig):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config must be a dict or None, got {type(value).__name__}")
    known = set(SpeculativeConfig.__dataclass_fields__)
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"speculative_config has unknown key(s) {unknown}; known: {sorted(known)}")
    method = value.get("method", "ngram")
    if method not in METHODS:
        raise ValueError(f"speculative_config.method must be one of {METHODS}, got {method!r}")
    keys = ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "max_decoding_seqs")
    for key in (*keys, "probe_interval", "max_num_speculative_tokens"):
        v = value.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"speculative_config.{key} must be a positive integer, got {v!r}")
    mp = value.get("min_priority")
    if mp is not None and (not isinstance(mp, int) or isinstance(mp, bool)):
        raise ValueError(f"speculative_config.min_priority must be an integer, got {mp!r}")
    ma = value.get("min_acceptance")
    if ma is not None and (not isinstance(ma, (int, float)) or isinstance(ma, bool) or not 0 <= ma < 1):
        raise ValueError(f"speculative_config.min_acceptance must be a number in [0, 1), got {ma!r}")
    _check_method_keys(method, value)
    config = SpeculativeConfig(**value)
    if config.prompt_lookup_min > config.prompt_lookup_max:
        raise ValueError(
            f"speculative_config.prompt_lookup_min ({config.prompt_lookup_min}) must be <= "
            f"prompt_lookup_max ({config.prompt_lookup_max})"
        )
    top = config.max_num_speculative_tokens
    if top is not None and top < config.num_speculative_tokens:
        raise ValueError(
            f"speculative_config.max_num_speculative_tokens ({top}) must be >= "
            f"num_speculative_tokens ({config.num_speculative_tokens})"
        )
    return config


def _check_method_keys(method: str, value: dict) -> None:
    """Each method's own keys, and none of the other's."""
    other = DRAFT_MODEL_KEYS if method == "ngram" else NGRAM_KEYS
    stray = [k for k in other if k in value]
    if stray:
        raise ValueError(f"speculative_config key(s) {stray} do not apply to method {method!r}")
    if method != "draft_model":
        return
    model = value.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError(
            "speculative_config.model must name the draft model (a model name, a folder, or "
            f"{SELF!r}: the target's own weights) for method 'draft_model', got {model!r}"
        )
    if value.get("quantization") not in (None, "int8"):
        raise ValueError(
            f"speculative_config.quantization must be None or 'int8', got {value['quantization']!r}"
        )
