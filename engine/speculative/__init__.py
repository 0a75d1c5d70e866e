"""Speculative decoding inside the continuous batch (docs/speculative.md): prompt-lookup drafts
(ngram.py), proposed at scheduling time, verified in the step's one forward (verify.py)."""

from engine.speculative.config import SpeculativeConfig, parse_speculative_config

__all__ = ["SpeculativeConfig", "parse_speculative_config"]
