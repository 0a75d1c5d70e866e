"""CUDA graphs for decode-only steps: the whole forward of a batch of single-token decodes,
captured once per batch size and replayed, so a step costs one graph launch instead of a few
hundred kernel launches (about 9 us each on an H100's host; a 1B model's decode step at batch 1
is under a millisecond of memory traffic).

Inputs live in static device buffers that every graph reads: token ids, positions, slot mapping
and context lengths ([4, max_batch] int64, one copy per step) and the block tables
([max_batch, max_blocks]). A step of n decodes runs the graph of the next captured size b >= n;
rows n..b-1 are padding (slot -1: no KV write; context 0: zero attention) and are dropped.
Needs an attention backend whose kernels honour that padding (`supports_cuda_graphs`).
With `lora` (engine/lora/graph.py), each size has a second graph for steps with LoRA rows: the
same forward with the LoRA launches over static segment tables; steps without keep the first.
With capture=False the same static buffers and padding run eagerly (how tests check them on CPU).
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import torch

from engine.attention import AttentionMetadata

if TYPE_CHECKING:
    from engine.lora.batch import LoRABatch
    from engine.lora.graph import StaticLoRA
    from engine.models.llama import LlamaModel


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 32: padding wastes at most ~1/8 of a step."""
    sizes = [1, 2, 4] + list(range(8, 65, 8)) + list(range(96, max_batch + 32, 32))
    return sorted({min(s, max_batch) for s in sizes})


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[torch.Tensor],
        block_size: int,
        max_batch: int,
        max_blocks: int,
        device: torch.device,
        capture: bool = True,
        lora: StaticLoRA | None = None,
    ):
        self.model = model
        self.lora = lora
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.capture = capture
        self.pin = device.type == "cuda"
        self.sizes = capture_sizes(max_batch)
        m = self.sizes[-1]
        self.vectors = torch.zeros(4, m, dtype=torch.int64, device=device)  # ids, positions, slots, contexts
        self.vectors[2] = -1
        self.tables = torch.zeros(m, max_blocks, dtype=torch.int64, device=device)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}  # (size, with LoRA) ->
        self.outputs: dict[tuple[int, bool], torch.Tensor] = {}
        self.replays = 0  # decode steps served by a graph
        if capture:
            self._capture_all(device)

    def _capture_all(self, device: torch.device) -> None:
        """Largest first: smaller graphs reuse its memory pool. The garbage collector stays off while
        capturing: a collection inside a capture can free tensors of an earlier engine (pinned host
        buffers whose release records an event on the capturing stream), which invalidates the
        capture ("operation failed due to a previous error during capture"). A capture is also
        private to this thread, so another thread's CUDA calls (an engine beside this one) cannot
        break it."""
        gc.collect()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            pool = None
            for b in reversed(self.sizes):
                for key in [(b, False), (b, True)] if self.lora is not None else [(b, False)]:
                    ids, pos, meta = self._inputs(b)
                    lora = self._lora(*key)
                    self.model.forward(ids, pos, meta, self.kv_caches, lora=lora)  # compiles; no writes
                    torch.cuda.synchronize(device)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                        self.outputs[key] = self.model.forward(ids, pos, meta, self.kv_caches, lora=lora)
                    pool = graph.pool()
                    self.graphs[key] = graph
        finally:
            if was_enabled:
                gc.enable()

    def _inputs(self, b: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        v = self.vectors
        meta = AttentionMetadata(
            slot_mapping=v[2, :b],
            block_size=self.block_size,
            num_decodes=b,
            decode_block_tables=self.tables[:b],
            decode_context_lens=v[3, :b],
            prefills=[],
        )
        return v[0, :b], v[1, :b], meta

    def _lora(self, b: int, with_lora: bool) -> LoRABatch | None:
        """The static LoRA inputs a graph of size b reads (all zero: no segment, until a step's)."""
        return self.lora.batch(b) if with_lora and self.lora is not None else None

    def fits(self, num_decodes: int, lora: LoRABatch | None = None) -> bool:
        if lora is not None and (self.lora is None or not self.lora.fits(lora)):
            return False
        return 0 < num_decodes <= self.sizes[-1]

    def replay(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        lora: LoRABatch | None = None,
    ) -> torch.Tensor:
        """ids, positions and meta of n decodes, on the host, and their LoRA rows (`fits` said yes).
        Returns the hidden states [n, hidden] (a view of the graph's output: read it before the
        next replay)."""
        n = ids.shape[0]
        b = next(s for s in self.sizes if s >= n)
        host = torch.zeros(4, b, dtype=torch.int64, pin_memory=self.pin)
        host[2] = -1
        host[0, :n], host[1, :n] = ids, positions
        tables, context_lens = meta.decode_block_tables, meta.decode_context_lens
        assert tables is not None and context_lens is not None, "a step without decodes"
        host[2, :n], host[3, :n] = meta.slot_mapping, context_lens
        self.vectors[:, :b].copy_(host, non_blocking=True)
        self.tables[:n, : tables.shape[1]].copy_(tables, non_blocking=True)  # gathered on the device
        if lora is not None:
            assert self.lora is not None
            self.lora.load(lora)
        self.replays += 1
        key = (b, lora is not None)
        if not self.capture:
            ids, pos, meta = self._inputs(b)
            return self.model.forward(ids, pos, meta, self.kv_caches, lora=self._lora(*key))[:n]
        self.graphs[key].replay()
        return self.outputs[key][:n]
