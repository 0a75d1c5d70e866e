"""Rotary tables per layer type, as transformers computes them (its rope init functions), laid out
for the forward: cos and sin [P, R] (R = the rotary dims), sin with its first half negated.

Longrope: transformers rotates a forward's tokens with the long factors when the forward's longest
position is past original_max_position_embeddings, else with the short ones. The table is then
[2P, R], short rows first: the model runner passes row P + p for a token at position p that takes
the long factors (`rope_rows`)."""

from __future__ import annotations

from typing import Any

import torch

from engine.models.spec import FULL, SLIDING, ModelSpec


def _inv_freq(
    config: Any, params: dict[str, Any], spec: ModelSpec, layer_type: str | None, seq_len: int | None
) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = params.get("rope_type", "default")
    if kind == "default":
        dim = spec.rotary_dim
        base = params["rope_theta"]
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), 1.0
    kwargs = {"layer_type": layer_type} if layer_type else {}
    return ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len, **kwargs)


def _table(
    inv_freq: torch.Tensor, scaling: float, positions: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq.float()[None, :]  # [P, R/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)
    half = cos.shape[-1] // 2
    return cos.to(device), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(device)


def rope_tables(
    config: Any, spec: ModelSpec, positions: int, dtype: torch.dtype, device: torch.device | str
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{layer type: (cos, sin)} for every layer type of the model."""
    config.standardize_rope_params() if hasattr(config, "standardize_rope_params") else None
    all_params = config.rope_parameters
    tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer_type in sorted(set(spec.layer_types) | {FULL}):
        if spec.per_type_rope:
            params, key = all_params.get(layer_type) or all_params[FULL], layer_type
        else:
            params, key = all_params, None
        if layer_type == SLIDING and not spec.per_type_rope and FULL in tables:
            tables[layer_type] = tables[FULL]
            continue
        inv, scaling = _inv_freq(config, params, spec, key, None)
        cos, sin = _table(inv, scaling, positions, dtype, device)
        if params.get("rope_type") == "longrope":
            long_inv, _ = _inv_freq(config, params, spec, key, spec.long_rope_after + 1)
            lcos, lsin = _table(long_inv, scaling, positions, dtype, device)
            cos, sin = torch.cat((cos, lcos)), torch.cat((sin, lsin))
        tables[layer_type] = (cos, sin)
    return tables


def rope_rows(positions: list[int], lengths: list[int], long_after: int, num_positions: int) -> list[int]:
    """Table rows of tokens at `positions`, for a longrope model: a token takes the long factors when
    its `lengths` entry or its own position is past `long_after`. Llama-style longrope passes each
    sequence's prompt length (transformers' prefill rotates the whole prompt by its length; later
    tokens by their own position); Phi-3 passes the sequence's whole length (its generate recomputes
    everything with the long factors once the sequence passes the original context)."""
    return [p + num_positions if max(p + 1, n) > long_after else p for p, n in zip(positions, lengths)]
