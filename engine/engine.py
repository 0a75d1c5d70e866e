"""The engine: add_request / abort / step. Owns the scheduler, the block manager, the runner and the
table of the requests it holds. A step is schedule (engine/scheduler) → run (engine/model_runner.py)
→ process (engine/output.py); n > 1 choices are engine/choices.py."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from engine.choices import Choices, later_choices
from engine.config import EngineConfig
from engine.detokenizer import Detokenizer
from engine.device import resolve_device, resolve_dtype
from engine.engine_request import EngineRequest
from engine.errors import DuplicateRequestError, InvalidRequestError, SLOUnattainableError
from engine.interrupts import Interrupt, Interrupts
from engine.kv_cache import make_block_manager
from engine.loader import load_model
from engine.lora.request import LoRARequest, acquire_adapter, pin_again
from engine.model_runner import ModelRunner
from engine.output import OutputProcessor
from engine.prompt_checks import check_context, check_prompt, check_token_ids
from engine.request import FinishReason, RequestOutput, SamplingParams, SeqEvent, Sequence
from engine.request_table import RequestTable
from engine.scheduler import Scheduler, StepPlan
from engine.speculative.drafters import make_drafter
from engine.speculative.verify import settle, tally
from engine.stats import EngineStats, StepRun

if TYPE_CHECKING:
    from engine.scheduler.load import SLOLoad
    from engine.scheduler.room import Room
    from engine.structured.manager import StructuredOutputs

TokenIds = list[int] | tuple[int, ...]


class Engine:
    """A preemptive continuous-batching engine over a paged KV cache. Single-threaded: call
    add_request/abort between steps."""

    def __init__(self, config: EngineConfig | None = None, **overrides: Any):
        config = replace(config, **overrides) if config else EngineConfig(**overrides)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        device = resolve_device(config.device)
        loaded = load_model(
            config.model,
            cache_dir=config.cache_dir,
            dummy_config=config.dummy_config,
            seed=config.seed,
            device=device,
            dtype=resolve_dtype(config.dtype, device),
        )
        self.model_name = loaded.name
        self.model_path = loaded.path
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.vocab_size = loaded.config.vocab_size
        max_pos = loaded.config.max_position_embeddings
        max_len = min(config.max_model_len or max_pos, max_pos)
        self.runner = ModelRunner(loaded, replace(config, max_model_len=max_len), max_len)
        # A sequence must fit the whole cache on its own, or it could never finish (where every
        # layer slides, each only needs its window's blocks: then the context alone caps it).
        window = self.runner.model.spec.releasable_window
        self.max_model_len = max_len if window else min(max_len, self.runner.num_blocks * config.block_size)
        self.config = replace(config, max_model_len=self.max_model_len)
        swap = self.runner.swap_space
        # longrope: a cached token's rotation depends on its sequence's length, not on its prefix
        prefix = config.enable_prefix_caching and not self.runner.model.spec.long_rope_after
        manager = make_block_manager(
            self.runner.kv_cache, config.block_size, enable_prefix_caching=prefix, window=window
        )
        self.block_manager = self.runner.follow(manager)  # the runner keeps its tables on the device
        # Measured once here: what preemption_mode "auto" weighs against recomputation.
        self.swap_cost = swap.measure() if swap.num_blocks else None
        self.lora = self.runner.lora  # LoRAManager, or None with max_loras=0
        self.scheduler = Scheduler(
            self.config,
            self.block_manager,
            swap_cost=self.swap_cost,
            admit_check=self.lora.can_admit if self.lora else None,
            drafter=make_drafter(self.config, self.max_model_len, loaded, self.runner),
        )
        self.detokenizer = Detokenizer(self.tokenizer) if self.tokenizer is not None else None
        self.requests = RequestTable()
        self.choices = Choices(self.requests, self.scheduler)
        self._structured: StructuredOutputs | None = None  # made on the first structured request
        self.output = OutputProcessor(
            self.requests,
            self.choices,
            self.scheduler,
            detokenizer=self.detokenizer,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            lora=self.lora,
            structured=lambda: self._structured,
        )
        self.stats = EngineStats()
        self.interrupts = Interrupts(self)  # nested steps of urgent prompts (Engine.step's interrupt)

    @property
    def structured(self) -> StructuredOutputs:
        """Grammar-constrained decoding (engine/structured): made on first use (it loads xgrammar)."""
        if self._structured is None:
            from engine.structured.manager import for_engine

            self._structured = for_engine(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._structured

    # ---- requests --------------------------------------------------------------------------
    def validate(
        self, prompt_token_ids: TokenIds, params: SamplingParams, resume_token_ids: TokenIds = ()
    ) -> None:
        """Raise InvalidRequestError (with a clear message and the offending param) for bad input."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams", param="params")
        check_prompt(prompt_token_ids, vocab_size=self.vocab_size)
        if resume_token_ids:
            if params.n > 1:
                raise InvalidRequestError(
                    "resume_token_ids cannot continue an n > 1 request", param="resume_token_ids"
                )
            check_token_ids(resume_token_ids, "resume_token_ids", vocab_size=self.vocab_size)
            if len(resume_token_ids) >= params.max_tokens:
                raise InvalidRequestError(
                    "resume_token_ids already reach max_tokens", param="resume_token_ids"
                )
        check_context(len(prompt_token_ids), params.max_tokens, max_model_len=self.max_model_len)
        bad = [t for t in params.stop_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"unknown stop token id(s) {bad}: the vocabulary has {self.vocab_size} tokens",
                param="stop_token_ids",
            )
        bad = [t for t, _ in params.logit_bias if t >= self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"logit_bias names token id(s) {bad} outside the vocabulary [0, {self.vocab_size})",
                param="logit_bias",
            )
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a model with a tokenizer", param="stop")
        if params.structured is not None:
            if self.tokenizer is None:
                raise InvalidRequestError(
                    "structured outputs need a model with a tokenizer", param="structured"
                )
            if self._structured is None or params.structured not in self._structured.cache:
                from engine.structured.grammar import check

                check(params.structured)  # what xgrammar refuses, refused here (a few ms, no compile)

    def add(self, request: EngineRequest) -> None:
        """Queue a request (``add_request`` with its fields)."""
        self.add_request(
            request.request_id,
            list(request.prompt_token_ids),
            request.sampling,
            tenant=request.tenant,
            weight=request.weight,
            priority=request.priority,
            arrival_time=request.arrival_time,
            ttft_target_s=request.ttft_target_s,
            tpot_target_s=request.tpot_target_s,
            lora=request.lora,
            resume_token_ids=request.resume_token_ids,
        )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        tenant: str = "default",
        weight: float = 1.0,
        priority: int = 0,
        arrival_time: float | None = None,
        ttft_target_s: float | None = None,
        tpot_target_s: float | None = None,
        lora: str | LoRARequest | None = None,
        resume_token_ids: TokenIds = (),
    ) -> None:
        """Queue a request. `resume_token_ids` are output tokens already produced elsewhere (a dead
        worker's): generation continues after them and they count toward max_tokens. `lora`: a
        PEFT adapter folder (or a LoRARequest); a bad adapter raises a named AdapterError."""
        if request_id in self.requests:
            raise DuplicateRequestError(
                f"request {request_id!r} is already in the engine", param="request_id"
            )
        self.validate(prompt_token_ids, params, resume_token_ids)
        if not (isinstance(weight, int | float) and 0 < weight < float("inf")):  # NaN, None: no
            raise InvalidRequestError("weight must be a positive, finite number", param="weight")
        lora = acquire_adapter(self.lora, lora)
        seq = Sequence(
            request_id=request_id,
            token_ids=list(prompt_token_ids) + list(resume_token_ids),
            num_prompt_tokens=len(prompt_token_ids),
            params=params,
            tenant=tenant,
            weight=weight,
            priority=priority,
            ttft_target_s=ttft_target_s,
            tpot_target_s=tpot_target_s,
            lora=lora,
            num_resumed_tokens=len(resume_token_ids),
        )
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        try:
            # A structured request whose grammar is compiling waits out of the scheduler until it is
            # ready. An SLO policy may refuse it here (SLOUnattainableError): nothing is kept.
            if params.structured is None or self.structured.add(seq):
                self.scheduler.add(seq)
        except Exception as exc:
            if params.structured is not None:
                self.structured.release(seq)
            if lora is not None and self.lora is not None:
                self.lora.release(lora)
            if isinstance(exc, SLOUnattainableError):
                self.stats.slo_refusals += 1
            raise
        self._track(seq, len(resume_token_ids))
        self.requests.add(seq)
        if params.n > 1:
            later = later_choices(seq, lambda: pin_again(self.lora, lora))
            for choice in later:
                self._track(choice)
            self.choices.add(seq, later)

    def _track(self, seq: Sequence, num_resumed: int = 0) -> None:
        """A sequence's own seeded generator and detokenizer state."""
        params = seq.params
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        text_state = None
        if self.detokenizer is not None and (self.config.incremental_text or params.stop):
            text_state = self.detokenizer.start(num_resumed)
        self.requests.track(seq.request_id, text_state, generator)

    def check_lora(self, lora: str | os.PathLike | LoRARequest) -> None:
        """Validate an adapter (and keep it in the host cache) without queueing anything."""
        uid = acquire_adapter(self.lora, lora)
        if uid is not None and self.lora is not None:
            self.lora.release(uid)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. False if it is unknown or already done."""
        seq_ids, unstarted = self.choices.end(request_id)  # every choice of an n > 1 request
        self.output.release_unstarted(unstarted)
        found = False
        for seq_id in seq_ids:
            seq = self.requests.get(seq_id)
            if seq is not None:
                seq.finish_reason = FinishReason.ABORT
                self.output.release(seq)
                found = True
        return found

    def take_events(self, request_id: str) -> list[SeqEvent]:
        """The request's events (SeqEvent) not yet handed out in a RequestOutput: call before
        abort() to keep what happened to an aborted request. Empty if it is unknown."""
        seq = self.requests.get(request_id)
        return seq.take_events() if seq is not None else []

    # ---- stepping --------------------------------------------------------------------------
    def step(self, interrupt: Interrupt | None = None) -> list[RequestOutput]:
        """One iteration: schedule, run the model once over every scheduled token and sample, process.
        ``interrupt``: urgent prompts that arrive during the forward may run between its layers."""
        outputs = self._admit_compiled()
        plan = self.scheduler.schedule()
        swap_seconds = self.runner.stage(plan, self.scheduler.running)  # even when nothing runs
        outputs += [self.output.refused(seq, error) for seq, error in plan.refused]
        ran = self._run(plan, interrupt) if not plan.is_empty else None
        self.stats.record_step(
            plan,
            ran,
            swap_seconds=swap_seconds,
            scheduler=self.scheduler,
            block_manager=self.block_manager,
            lora=self.lora,
        )
        verified = tally(plan, ran.sampled, self.stats) if ran and self.scheduler.drafter else []
        outputs += self.output.process(ran.sampled if ran else (), time.monotonic())
        settle(verified, self.block_manager)  # kept drafts computed, rejected drafts' blocks freed
        return outputs

    def _run(self, plan: StepPlan, interrupt: Interrupt | None = None) -> StepRun:
        """The plan's forward and sampling; the scheduler then advances the sequences it ran."""
        start = time.perf_counter()
        self.scheduler.complete_drafts(plan)  # a draft model drafts here (its time is the step's)
        if self._structured is not None:
            self._structured.prepare(plan)  # grammar bitmasks, on a thread, while the forward runs
        with self.interrupts.during(plan, interrupt) as nested:
            sampled = self.runner.run(plan, self.requests.generators, self._structured)
        seconds = time.perf_counter() - start - nested.seconds
        self.scheduler.observe_step(plan, seconds)  # feeds an SLO policy's step-cost model
        decode_tokens = 0
        for item in plan.scheduled:  # what each item is, read before finish_step advances it
            if item.is_output_decode:
                decode_tokens += 1
            else:
                item.seq.record("prefill_chunk", tokens=item.num_tokens, start=item.seq.num_computed_tokens)
        self.scheduler.finish_step(plan)
        experts, weight_bytes = self.runner.model.step_weight_bytes()
        return StepRun(sampled, seconds, decode_tokens, experts, weight_bytes)

    def _admit_compiled(self) -> list[RequestOutput]:
        """Structured requests whose grammar has compiled join the scheduler; one whose grammar
        failed, or that an SLO policy refuses now, finishes with its error."""
        structured = self._structured
        if structured is None or not structured.compiling:
            return []
        if not self.scheduler.has_unfinished():
            structured.wait(0.01)  # nothing else to run: no busy loop while a grammar compiles
        outputs = []
        for seq, error in structured.take_ready(self.requests.seqs):
            if error is not None:
                outputs.append(self.output.failed(seq, error))
                continue
            try:
                self.scheduler.add(seq)
            except SLOUnattainableError as exc:
                self.stats.slo_refusals += 1
                outputs.append(self.output.refused(seq, exc))
        return outputs

    def predict_ttft(self, num_prompt_tokens: int, priority: int = 0) -> float | None:
        """Predicted seconds to the first token of a request added now; None unless the policy is
        SLO-aware. The gateway refuses at the door with it."""
        return self.scheduler.predict_ttft(num_prompt_tokens, priority)

    def slo_load(self) -> SLOLoad | None:
        """What predict_ttft reads, as plain numbers (an `SLOLoad`), or None unless the policy is
        SLO-aware: workers publish it so that gateways predict TTFT without the engine."""
        return self.scheduler.slo_load()

    # ---- state -----------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(
            self._structured is not None and self._structured.compiling
        )

    def has_room(self) -> bool:
        """Would one more request start at the next step? (See Scheduler.has_room.)"""
        return self.scheduler.has_room(self.requests.waiting())

    def room(self, priorities: list[int]) -> Room:
        """Requests of each of `priorities` that would start at the next step (Scheduler.room)."""
        return self.scheduler.room(self.requests.waiting(), priorities)

    @property
    def speculative_method(self) -> str | None:
        """The speculative decoding method in use ("ngram", "draft_model"), or None: speculation off."""
        return self.scheduler.drafter.method if self.scheduler.drafter is not None else None

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.block_manager.num_blocks

    @property
    def num_swapped(self) -> int:
        """Waiting sequences whose KV is in host memory (preempted by swap)."""
        return sum(1 for s in self.requests.seqs.values() if self.block_manager.is_swapped(s))

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    # The request table's maps under the names tests and benchmarks read.
    @property
    def seqs(self) -> dict[str, Sequence]:
        """Every live sequence by sequence id (RequestTable.seqs)."""
        return self.requests.seqs

    @property
    def _forks(self) -> dict[str, list[Sequence]]:
        return self.requests.unstarted_choices

    @property
    def _choices(self) -> dict[str, list[str]]:
        return self.requests.choice_ids

    @property
    def _open(self) -> dict[str, int]:
        return self.requests.open_choices
