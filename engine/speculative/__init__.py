"""Speculative decoding inside the continuous batch (docs/speculative.md): prompt-lookup drafts
(ngram.py) or a draft model's (draft_model.py, built by drafters.py), for the sequences the policy
lets speculate (policy.py), verified in the step's one forward (verify.py)."""

from engine.speculative.config import SpeculativeConfig, parse_speculative_config

__all__ = ["SpeculativeConfig", "parse_speculative_config"]
