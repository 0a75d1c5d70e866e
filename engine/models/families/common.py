"""What most families share: the config fields every decoder has, and the checks of fields whose
values the forward would otherwise ignore."""

from __future__ import annotations

from typing import Any

from engine.models.spec import ACTIVATIONS, FULL, ROPE_TYPES, SLIDING, ModelSpec, UnsupportedModelError


def rope_params(config: Any) -> dict[str, Any]:
    """config.rope_parameters as one flat dict (the full-attention layers' where keyed by layer type)."""
    params = getattr(config, "rope_parameters", None) or {}
    if FULL in params or SLIDING in params:
        params = params.get(FULL) or params.get(SLIDING) or {}
    return params


def base(config: Any, family: str, **switches: Any) -> ModelSpec:
    """The spec of a Llama-shaped decoder, with the family's switches on top."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    rope = rope_params(config)
    activation = switches.pop("activation", None) or config.hidden_act
    if activation not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"{family}: hidden activation {activation!r} is not supported "
            f"(supported: {', '.join(ACTIVATIONS)})"
        )
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    spec = dict(
        family=family,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate_size=config.intermediate_size,
        eps=getattr(config, "rms_norm_eps", 1e-6),
        activation=activation,
        rotary_dim=int(head_dim * partial),
        tied=bool(getattr(config, "tie_word_embeddings", False)),
    )
    spec.update(switches)
    for params in _all_rope_params(config):
        kind = params.get("rope_type", "default")
        if kind not in ROPE_TYPES:
            raise UnsupportedModelError(f"{family}: rope_type {kind!r} is not supported")
        if kind == "longrope":
            spec["long_rope_after"] = int(
                params.get("original_max_position_embeddings")
                or getattr(config, "original_max_position_embeddings", None)
                or config.max_position_embeddings
            )
    return ModelSpec(**spec)


def _all_rope_params(config: Any) -> list[dict[str, Any]]:
    params = getattr(config, "rope_parameters", None) or {}
    if FULL in params or SLIDING in params:
        return [p for p in params.values() if p]
    return [params]


def layer_types(config: Any, *, all_slide: bool = False) -> tuple[str, ...]:
    """config.layer_types where the config has them; else every layer slides when `all_slide` and
    the config sets a window (Mistral, Phi-3)."""
    types = getattr(config, "layer_types", None)
    if types:
        return tuple(types)
    slide = all_slide and getattr(config, "sliding_window", None)
    return ((SLIDING if slide else FULL),) * config.num_hidden_layers


def window(config: Any, types: tuple[str, ...]) -> int:
    if SLIDING not in types:
        return 0
    w = getattr(config, "sliding_window", None)
    if not w:
        raise UnsupportedModelError("layer_types names sliding layers but sliding_window is not set")
    return int(w)
