"""Checking an upload against the served model without torch: the engine's own validation
(engine.lora: the config, then the safetensors header parsed directly) against the model's shape,
read from its config (engine.assets.model_config) once per process."""

from __future__ import annotations

import functools
import json
import struct
from typing import Any, BinaryIO

from engine.assets import model_config
from engine.lora import (
    AdapterSpec,
    AdapterWeightsError,
    ModelShape,
    inspect_adapter,
    parse_config,
    read_header,
)

HEADER_READ_LIMIT = 64 << 20  # read_header refuses a longer safetensors header


@functools.lru_cache(maxsize=4)
def _shape(model: str, dummy_config: str) -> ModelShape:
    return ModelShape.from_config(model_config(model, dummy_config=json.loads(dummy_config)))


def served_shape(model: str, dummy_config: dict[str, Any] | None) -> ModelShape:
    """The served model's layer count and projection sizes (cached: a GGUF file's metadata takes
    seconds to read)."""
    return _shape(model, json.dumps(dummy_config or {}, sort_keys=True))


def inspect_upload(
    config: bytes, weights: BinaryIO, weights_size: int, shape: ModelShape, max_rank: int
) -> AdapterSpec:
    """Validate adapter_config.json's bytes and the weights file (only its header is read) against
    the base model; raises the engine's named AdapterError, whose message says what is wrong."""
    parse_config(config, max_rank)  # the config's problems first: they are the cheaper to name
    weights.seek(0)
    head = weights.read(8)
    if len(head) < 8:
        raise AdapterWeightsError("adapter_model.safetensors is truncated: no header", param="adapter_model")
    (n,) = struct.unpack("<Q", head)
    head += weights.read(min(n, HEADER_READ_LIMIT))
    header = read_header(head, weights_size)
    return inspect_adapter(config, header, shape, max_rank, size_bytes=len(config) + weights_size)
