"""Turns a step plan into tensors, runs the model over the paged KV cache and samples; owns the
device, the KV cache, the host swap space and the decode CUDA graphs.

Step tensors are built on the host and copied to the device through pinned memory without
waiting (docs/gpu.md); block tables stay on the device, where only their changed entries are
written (engine/block_tables.py). The only sync of a step is reading the sampled token ids back."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from engine.attention import AttentionMetadata, make_backend
from engine.block_manager import BlockManager
from engine.block_tables import DeviceBlockTables
from engine.config import EngineConfig
from engine.cuda_graphs import DecodeGraphs
from engine.device import host_to_device, resolve_device, resolve_dtype, select_device
from engine.kv_cache import allocate_kv_cache
from engine.kv_groups import HybridBlockManager
from engine.loader import LoadedModel
from engine.logits_processing import collect_prompt_logprobs, process_logits, token_logprobs
from engine.models import LlamaModel, resolve
from engine.models.decode import DecodeForward
from engine.models.rope import rope_rows
from engine.request import Sequence, TokenLogprob
from engine.sampler import sample_ids
from engine.scheduler import ScheduledSeq, StepPlan
from engine.speculative.verify import split_drafted, verify
from engine.step_meta import attention_meta, step_to_device

if TYPE_CHECKING:
    from engine.lora.graph import StaticLoRA
    from engine.lora.manager import LoRAManager
    from engine.structured.manager import StructuredOutputs


class ModelRunner:
    def __init__(self, loaded: LoadedModel, config: EngineConfig, max_model_len: int):
        cfg: Any = loaded.config  # transformers types its fields as optional
        spec = resolve(cfg)  # UnsupportedModelError for a family the registry does not serve
        self.device = resolve_device(config.device)
        select_device(self.device)  # cuda:N, N != 0: Triton launches on the current device
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.block_size = config.block_size
        num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        backend = make_backend(
            config.attention_backend, num_heads, self.num_kv_heads, self.head_dim, self.device
        )
        weights = {
            k: t.to(self.device, self.dtype if t.is_floating_point() and not _fp32(k) else t.dtype)
            for k, t in loaded.state_dict.items()
        }  # no copy where the loader drew them there; sink logits keep their own precision
        self.model = LlamaModel.from_state_dict(
            cfg,
            weights,
            self.dtype,
            backend,
            max_model_len,
            config.quantization,
            cpu_kernels=config.cpu_kernels,
            cpu_amx=config.cpu_amx,
        )
        del weights
        # Fast paths, chosen here: the CPU one-call decode (below) and CUDA graphs (further down).
        one_call = config.cpu_kernels and self.model.spec.supports_one_call_decode
        self.model.decode = DecodeForward.make(self.model) if one_call else None
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = frozenset(loaded.eos_token_ids)  # masked for rows below their min_tokens
        cache = allocate_kv_cache(config, self.model.spec, backend, self.dtype, self.device)
        self.kv_cache = cache
        self.kv_caches = cache.kv_caches
        self.num_blocks = cache.num_blocks
        self.swap_space = cache.swap_space
        self.sliding_window = cache.sliding_window  # > 0: the sliding layers' blocks in their own pool
        # every sequence's block table in a row on the device, updated where it changes (`follow`)
        max_blocks, rows = -(-max_model_len // self.block_size) + 1, config.max_num_seqs + 1
        self.tables = DeviceBlockTables(max_blocks, self.device, rows)
        self.sliding_tables = (
            DeviceBlockTables(max_blocks, self.device, rows) if self.sliding_window else None
        )
        if self.device.type == "cuda":
            from engine.kernels.warmup import warm_up  # imports triton

            warm_up(self.model, self.kv_caches, self.block_size)  # no compile stalls while serving
        self.lora = _lora_manager(config, cfg, self.model.embed.device)
        self.graphs: DecodeGraphs | None = None
        if (
            config.cuda_graphs
            and self.device.type == "cuda"
            and backend.supports_cuda_graphs
            and self.model.graph_safe
            and not self.sliding_window  # the graphs capture one block table per row
        ):
            self.graphs = DecodeGraphs(
                self.model,
                self.kv_caches,
                self.block_size,
                max_batch=config.cuda_graph_max_batch or config.max_num_seqs,
                max_blocks=-(-max_model_len // self.block_size),
                device=self.device,
                lora=_static_lora(self.lora),
            )

    def follow(self, manager: BlockManager | HybridBlockManager) -> BlockManager | HybridBlockManager:
        """Keep the block tables of `manager`'s sequences on the device (the sliding pool's apart);
        returns it."""
        if isinstance(manager, HybridBlockManager):
            assert self.sliding_tables is not None, "a sliding pool of its own without sliding layers"
            self.tables.follow(manager.full)
            self.sliding_tables.follow(manager.sliding)
        else:
            self.tables.follow(manager)
        return manager

    def stage(self, plan: StepPlan, running: list[Sequence]) -> float:
        """Before the plan's forward, even when it runs nothing: the adapters of every running
        sequence into device slots, then the plan's block copies. Returns the seconds of the copies."""
        if self.lora is not None:
            self.lora.activate(running)
        if not (plan.swap_out or plan.swap_in):
            return 0.0
        start = time.perf_counter()
        self.swap(plan)
        return time.perf_counter() - start

    def swap(self, plan: StepPlan) -> None:
        """The plan's block copies: swap-outs first (their device blocks may be handed out again in
        the same step), then swap-ins."""
        if plan.swap_out:
            self.kv_cache.swap_out(plan.swap_out)
        if plan.swap_in:
            self.kv_cache.swap_in(plan.swap_in)

    @torch.inference_mode()
    def run(
        self,
        plan: StepPlan,
        generators: dict[str, torch.Generator],
        structured: StructuredOutputs | None = None,
    ) -> list[tuple[ScheduledSeq, int, TokenLogprob | None]]:
        """Run one step; returns (item, sampled token, its logprob if asked) for every item that
        reached its sequence's end. Prefill chunks of sequences that asked for prompt logprobs
        append them to seq.prompt_logprobs (from this forward's hidden states: no second forward).
        `structured`: the engine's StructuredOutputs (engine/structured), which masks constrained rows."""
        select_device(self.device)  # the step may run in another thread than the one that built us
        items, hidden, sample_rows = self.forward(plan)
        self._prompt_logprobs(items, hidden)
        samplers = [it for it in items if it.samples]
        if not samplers:
            return []
        logits = self.model.logits(hidden[host_to_device(sample_rows, self.device)])  # [S, V] fp32
        if any(it.draft for it in samplers):  # speculative decoding: their rows verify their drafts
            drafted, drafted_logits, samplers, logits = split_drafted(samplers, logits)
            sampled = self._sample(samplers, logits, generators, structured)
            return sampled + verify(drafted, drafted_logits, generators)
        return self._sample(samplers, logits, generators, structured)

    def _sample(
        self,
        samplers: list[ScheduledSeq],
        logits: torch.Tensor,
        generators: dict[str, torch.Generator],
        structured: StructuredOutputs | None,
    ) -> list[tuple[ScheduledSeq, int, TokenLogprob | None]]:
        """One token per sampling item from its logits row (`logits`: [S, V] fp32, raw)."""
        if not samplers:
            return []
        seqs = [it.seq for it in samplers]
        want = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        raw = torch.log_softmax(logits[want], dim=-1) if want else None  # the model's own distribution
        logits = process_logits(logits, seqs, self.eos_token_ids)
        if structured is not None:  # after the penalties and biases: nothing the grammar forbids comes back
            structured.apply(logits, samplers)  # grammar-forbidden tokens to -inf, in place
            # a grammar always allows some token; a row has none left only where min_tokens banned EOS
            banned = [
                i
                for i, s in enumerate(seqs)
                if s.params.structured is not None and s.num_output_tokens < s.params.min_tokens
            ]
            if banned:  # where the grammar allows nothing but EOS, EOS wins (no mask read back)
                rows = host_to_device(torch.tensor(banned), self.device)[:, None]
                dead = torch.isinf(logits[rows[:, 0]]).all(dim=-1, keepdim=True)  # [B, 1]
                eos = host_to_device(torch.tensor(sorted(self.eos_token_ids)), self.device)[None, :]
                logits[rows, eos] = torch.where(dead, 0.0, logits[rows, eos])
        params = [s.params for s in seqs]
        gens = [generators.get(s.request_id) for s in seqs]
        tokens = sample_ids(logits, params, gens)  # [S] on the device
        logprobs: list[TokenLogprob | None] = [None] * len(seqs)
        if raw is not None:
            rows = host_to_device(torch.tensor(want), self.device)
            ks = [seqs[i].params.logprobs or 0 for i in want]  # set on every row of `want`
            for i, lp in zip(want, token_logprobs(raw, tokens[rows], ks)):
                logprobs[i] = lp
        return list(zip(samplers, tokens.tolist(), logprobs))

    def _prompt_logprobs(self, items: list[ScheduledSeq], hidden: torch.Tensor) -> None:
        """Prompt logprobs of the prefill chunks that owe them (rows: decodes first, then chunks)."""
        row = 0
        for it in items:
            if it.seq.needs_prompt_logits and not it.is_decode:
                collect_prompt_logprobs(
                    self.model, hidden, it.seq, row, it.seq.num_computed_tokens, it.num_tokens
                )
            row += self._span(it)[1]

    def forward(self, plan: StepPlan) -> tuple[list[ScheduledSeq], torch.Tensor, torch.Tensor]:
        """The model over the plan's tokens: (items in packed order, hidden [T, hidden], the rows
        that sample, in the order of the sampling items, on the host)."""
        items = sorted(plan.scheduled, key=lambda it: not self._is_decode(it))  # decodes first (stable)
        lora = None
        if self.lora is not None:  # rows regrouped so that each adapter's rows are contiguous
            items, lora = self.lora.batch(items)
        # a step of decodes and speculating decodes only: on the one-call decode (CPU), each draft
        # is one more decode row of its sequence (its own position and context length), so k + 1
        # rows verify in the same C forward as plain decodes (causal: a row sees the rows before it)
        as_decodes = (
            lora is None
            and self.model.decode is not None
            and not self.model.spec.long_rope_after
            and all(self._is_decode(it) or it.draft for it in items)
        )
        input_ids, positions, meta, sample_rows = self._prepare(items, as_decodes)  # on the host
        if self.graphs is not None and not meta.prefills and self.graphs.fits(meta.num_decodes, lora):
            return items, self.graphs.replay(input_ids, positions, meta, lora), sample_rows
        input_ids, positions, meta = self._to_device(input_ids, positions, meta)
        decode = self.model.decode
        if lora is None and decode is not None and decode.applies(meta, self.kv_caches):
            return items, decode(input_ids, positions, meta, self.kv_caches), sample_rows
        return items, self.model.forward(input_ids, positions, meta, self.kv_caches, lora=lora), sample_rows

    def _is_decode(self, it: ScheduledSeq) -> bool:
        """A decode row, unless it is Phi-3's longrope crossing: the token that takes the sequence past
        the original context recomputes all of it with the long factors (a prefill from position 0)."""
        spec = self.model.spec
        crossing = spec.long_rope_recompute and it.seq.num_computed_tokens == spec.long_rope_after
        return it.is_decode and not crossing

    def _span(self, it: ScheduledSeq) -> tuple[int, int]:
        """(first position, tokens) the item feeds this step."""
        if it.is_decode and not self._is_decode(it):
            return 0, it.seq.num_computed_tokens + 1
        return it.seq.num_computed_tokens, 1 if it.is_decode else it.num_query_tokens

    def _prepare(
        self, items: list[ScheduledSeq], as_decodes: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """The step's host tensors. `as_decodes`: every item is a decode, a speculating one as one
        decode row per fed token (its new token, then each draft)."""
        ids: list[int] = []
        pos: list[int] = []
        sample_rows: list[int] = []
        decodes = list(items) if as_decodes else [it for it in items if self._is_decode(it)]
        rows: list[tuple[Sequence, int]] = []  # (sequence, position) of each decode row
        for it in decodes:
            p = it.seq.num_computed_tokens
            ids += [it.seq.token_ids[p], *it.draft]
            pos += range(p, p + 1 + len(it.draft))
            rows += [(it.seq, q) for q in range(p, p + 1 + len(it.draft))]
        for it in items[len(decodes) :]:
            start, n = self._span(it)
            # a speculating decode feeds its drafts after its own new token (engine/speculative)
            ids += it.seq.token_ids[start : start + n - len(it.draft)] + it.draft
            pos += range(start, start + n)
        sample_rows += range(len(rows))  # every decode row samples
        spec = self.model.spec
        if spec.long_rope_after:  # longrope: each token's row of the short or long table

            def length(seq: Sequence) -> int:
                return len(seq.token_ids) if spec.long_rope_recompute else seq.num_prompt_tokens

            lens = [length(seq) for seq, _ in rows]
            lens += [length(it.seq) for it in items[len(decodes) :] for _ in range(self._span(it)[1])]
            pos = rope_rows(pos, lens, spec.long_rope_after, self.model.max_positions)
        chunks = [(it.seq, *self._span(it)) for it in items[len(decodes) :]]
        meta = attention_meta(self.block_size, rows, chunks, self.tables)
        if self.sliding_tables is not None:
            meta.sliding = attention_meta(self.block_size, rows, chunks, self.sliding_tables)
        row = len(rows)
        for it in items[len(decodes) :]:
            row += self._span(it)[1]
            if it.samples:  # a speculating item samples after its token and after each draft
                sample_rows += range(row - 1 - len(it.draft), row)
        # sample_rows follow `items` order restricted to samplers: decodes first, then prefills.
        return torch.tensor(ids), torch.tensor(pos), meta, torch.tensor(sample_rows, dtype=torch.long)

    def _to_device(
        self, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        return step_to_device(self.device, ids, pos, meta)


def _lora_manager(config: EngineConfig, model_config: Any, device: torch.device) -> LoRAManager | None:
    """The LoRA slots and host cache (engine/lora), or None when max_loras is 0. The adapters' weights
    stay fp32 in every model dtype (engine/lora/kernels: the delta is computed and added in fp32)."""
    if not config.max_loras:
        return None
    from engine.lora.manager import LoRAManager
    from engine.lora.shape import ModelShape

    return LoRAManager(
        ModelShape.from_config(model_config),
        max_loras=config.max_loras,
        max_lora_rank=config.max_lora_rank,
        max_cpu_loras=config.max_cpu_loras or 4 * config.max_loras,
        dtype=torch.float32,
        device=device,
        kernel=config.lora_kernel,
    )


def _static_lora(manager: LoRAManager | None) -> StaticLoRA | None:
    """The LoRA inputs of the decode graphs: with a kernel that launches from device tables alone
    (triton); otherwise steps with LoRA rows run eagerly."""
    if manager is None or not manager.kernel.supports_graphs:
        return None
    from engine.lora.graph import StaticLoRA

    return StaticLoRA(manager.slots, manager.kernel)


def _fp32(name: str) -> bool:
    """Tensors the model keeps in fp32 whatever its dtype: attention-sink logits (gpt-oss)."""
    return name.endswith("self_attn.sinks")
