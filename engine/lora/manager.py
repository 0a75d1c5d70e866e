"""The engine's LoRA state: adapters registered by requests (validated, in a host-memory cache),
the device slots, the admission check the scheduler asks, and each step's LoRABatch."""

from __future__ import annotations

import os
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path

import torch

from engine.lora.adapter import CONFIG_FILE, WEIGHTS_FILE
from engine.lora.admission import slot_admission
from engine.lora.batch import LoRABatch, build_batch
from engine.lora.errors import AdapterNotFoundError
from engine.lora.kernels import make_kernel
from engine.lora.request import LoRARequest
from engine.lora.shape import ModelShape
from engine.lora.slots import LoRASlots
from engine.lora.weights import LoRAWeights, load_adapter
from engine.request import Sequence


class LoRAManager:
    """Host cache: adapters of queued or running requests are pinned; beyond `max_cpu_loras` the
    least recently used unpinned ones are dropped (a later request reads the folder again).
    Device: `LoRASlots`, filled with the adapters of running sequences at each step."""

    def __init__(
        self,
        shape: ModelShape,
        *,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: int,
        dtype: torch.dtype,
        device: torch.device,
        kernel: str = "auto",
    ):
        self.shape = shape
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.dtype = dtype
        self.slots = LoRASlots(shape, max_loras, max_lora_rank, dtype, device)
        self.kernel = make_kernel(kernel, device.type)
        self.host: OrderedDict[str, LoRAWeights] = OrderedDict()  # uid -> weights, least recent first
        self._uid_of_files: dict[tuple, str] = {}  # (folder, mtimes, sizes) -> uid: skip re-reading
        self.pins: Counter[str] = Counter()  # uid -> unfinished requests using it
        self.host_loads = 0  # folders read and validated
        self.can_admit = slot_admission(max_loras)  # the scheduler's admission check (admission.py)

    # ---- requests --------------------------------------------------------------------------
    def acquire(self, lora: str | LoRARequest) -> str:
        """Validate and cache the adapter a request names (a folder path or a LoRARequest) and pin
        it for the request's lifetime. Returns its uid (content digest): the Sequence's `lora`.
        Raises an AdapterError naming what is wrong."""
        name, path = (lora.name, lora.path) if isinstance(lora, LoRARequest) else ("", lora)
        folder = Path(path)
        key = _files_key(folder)
        uid = self._uid_of_files.get(key)
        if uid is None or uid not in self.host:
            weights = load_adapter(folder, self.shape, self.max_lora_rank, self.dtype, name=name)
            uid = weights.uid
            self.host_loads += 1
            self.host.setdefault(uid, weights)
            self._uid_of_files[key] = uid
        self.host.move_to_end(uid)
        self.pins[uid] += 1
        self._trim_host()
        return uid

    def pin(self, uid: str) -> str:
        """Pin an adapter already pinned (in the host cache) once more; returns its uid."""
        assert self.pins[uid] > 0, f"adapter {uid} is not pinned"
        self.pins[uid] += 1
        return uid

    def release(self, uid: str) -> None:
        """A request that pinned `uid` finished or was aborted."""
        self.pins[uid] -= 1
        if self.pins[uid] <= 0:
            del self.pins[uid]
        self._trim_host()

    def _trim_host(self) -> None:
        for uid in [u for u in self.host if u not in self.pins][
            : max(0, len(self.host) - self.max_cpu_loras)
        ]:
            del self.host[uid]

    # ---- scheduling ------------------------------------------------------------------------
    def activate(self, running: Iterable[Sequence]) -> None:
        """Before a step's forward: the adapters of all running sequences in slots."""
        uids = {s.lora for s in running if s.lora is not None}
        if uids:
            self.slots.activate(uids, self.host.__getitem__)

    def batch(self, items: list) -> tuple[list, LoRABatch | None]:
        """Order a step's items (decodes first, as the runner packs them) so that each adapter's
        rows are contiguous, and build the LoRABatch; None when no item has an adapter."""
        slot_of = self.slots.slot_of
        slot = {id(it): slot_of[it.seq.lora] if it.seq.lora is not None else -1 for it in items}
        if all(s < 0 for s in slot.values()):
            return items, None
        items = sorted(items, key=lambda it: (not it.is_decode, slot[id(it)]))
        return items, build_batch(
            [(it.num_query_tokens, slot[id(it)]) for it in items], self.slots, self.kernel
        )

    @property
    def stats(self) -> dict[str, int]:
        return {
            "lora_slot_loads": self.slots.loads,
            "lora_slot_evictions": self.slots.evictions,
            "lora_host_loads": self.host_loads,
            "lora_resident": len(self.slots.slot_of),
            "lora_host_cached": len(self.host),
        }


def _files_key(folder: Path) -> tuple:
    """What identifies an adapter folder's current content without reading it."""
    try:
        stats = [os.stat(folder / f) for f in (CONFIG_FILE, WEIGHTS_FILE)]
    except OSError:
        missing = CONFIG_FILE if not (folder / CONFIG_FILE).is_file() else WEIGHTS_FILE
        param = "adapter_config" if missing == CONFIG_FILE else "adapter_model"
        raise AdapterNotFoundError(f"no {missing} in adapter folder {str(folder)!r}", param=param) from None
    return (str(folder.resolve()), *((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats))
