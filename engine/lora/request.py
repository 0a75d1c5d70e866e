"""How a request names its adapter. Plain Python."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name and PEFT folder (adapter_config.json + adapter_model.safetensors)."""

    name: str
    path: str
