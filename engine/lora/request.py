"""How a request names its adapter. Plain Python."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from engine.errors import InvalidRequestError
from engine.lora.errors import LoRADisabledError


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name and PEFT folder (adapter_config.json + adapter_model.safetensors)."""

    name: str
    path: str


class AdapterPins(Protocol):
    """What `acquire_adapter` needs of the LoRAManager (engine/lora/manager.py)."""

    def acquire(self, lora: str | LoRARequest) -> str: ...

    def pin(self, uid: str) -> str: ...


def acquire_adapter(manager: AdapterPins | None, lora: object) -> str | None:
    """The uid of the adapter a request names (a folder path or a LoRARequest; None: no adapter),
    validated, cached in host memory and pinned until the request ends (`manager.release`)."""
    if lora is None:
        return None
    if manager is None:
        raise LoRADisabledError("this engine serves no LoRA adapters (max_loras=0)", param="lora")
    if isinstance(lora, os.PathLike):
        lora = os.fspath(lora)
    if not isinstance(lora, (str, LoRARequest)):
        raise InvalidRequestError("lora must be an adapter folder path or a LoRARequest", param="lora")
    return manager.acquire(lora)


def pin_again(manager: AdapterPins | None, uid: str | None) -> str | None:
    """Pin an adapter that `acquire_adapter` pinned for the same request once more (the other
    choices of an n > 1 request): by its uid, without looking at its folder again."""
    if uid is None or manager is None:
        return None
    return manager.pin(uid)
