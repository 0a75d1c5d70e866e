"""The engine: add_request / abort / step. Owns the scheduler, the block manager and the runner."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import Detokenizer, DetokState, find_stop, holdback
from engine.device import resolve_device, resolve_dtype
from engine.engine_request import EngineRequest
from engine.errors import (
    DuplicateRequestError,
    InvalidRequestError,
    SLOUnattainableError,
)
from engine.loader import load_model
from engine.lora.errors import LoRADisabledError
from engine.lora.request import LoRARequest
from engine.model_runner import ModelRunner
from engine.models.spec import SLIDING
from engine.prompt_checks import check_context, check_prompt
from engine.request import FinishReason, RequestOutput, SamplingParams, Sequence, SequenceStatus
from engine.scheduler import Scheduler
from engine.stats import EngineStats


class Engine:
    """A preemptive continuous-batching engine over a paged KV cache. Single-threaded: call
    add_request/abort between steps."""

    def __init__(self, config: EngineConfig | None = None, **overrides):
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
        # A sequence must fit the whole cache on its own, or it could never finish.
        # (with a sliding window every layer only needs its window's blocks: then the context alone caps it)
        window = _releasable_window(self.runner.model.spec)
        self.max_model_len = max_len if window else min(max_len, self.runner.num_blocks * config.block_size)
        self.config = replace(config, max_model_len=self.max_model_len)
        swap = self.runner.swap_space
        self.block_manager = BlockManager(
            self.runner.num_blocks,
            config.block_size,
            # longrope: a cached token's rotation depends on its sequence's length, not on its prefix
            enable_prefix_caching=config.enable_prefix_caching and not self.runner.model.spec.long_rope_after,
            num_host_blocks=swap.num_blocks,
            sliding_window=_releasable_window(self.runner.model.spec),
        )
        # Measured once here: what preemption_mode "auto" weighs against recomputation.
        self.swap_cost = swap.measure() if swap.num_blocks else None
        self.lora = self.runner.lora  # LoRAManager, or None with max_loras=0
        self.scheduler = Scheduler(
            self.config,
            self.block_manager,
            swap_cost=self.swap_cost,
            admit_check=self.lora.can_admit if self.lora else None,
        )
        self.detokenizer = Detokenizer(self.tokenizer) if self.tokenizer is not None else None
        self.seqs: dict[str, Sequence] = {}
        self._detok: dict[str, DetokState] = {}
        self._generators: dict[str, torch.Generator] = {}
        # n > 1: choices 1..n-1 wait in _forks until choice 0's prompt is computed; _choices lists
        # every choice's sequence id while the request runs, _open counts those not finished
        self._forks: dict[str, list[Sequence]] = {}
        self._choices: dict[str, list[str]] = {}
        self._open: dict[str, int] = {}
        self.stats = EngineStats()
        self._structured = None  # StructuredOutputs, made on the first structured request

    @property
    def structured(self):
        """Grammar-constrained decoding (engine/structured): made on first use (it loads xgrammar)."""
        if self._structured is None:
            from engine.structured.manager import for_engine

            self._structured = for_engine(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._structured

    # ---- requests --------------------------------------------------------------------------
    def validate(self, prompt_token_ids, params: SamplingParams, resume_token_ids=()) -> None:
        """Raise InvalidRequestError (with a clear message and the offending param) for bad input."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams", param="params")
        check_prompt(prompt_token_ids, vocab_size=self.vocab_size)
        if resume_token_ids:
            if params.n > 1:
                raise InvalidRequestError(
                    "resume_token_ids cannot continue an n > 1 request", param="resume_token_ids"
                )
            self._check_ids(resume_token_ids, "resume_token_ids")
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

    def _check_ids(self, ids, name: str) -> None:
        if not isinstance(ids, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise InvalidRequestError(f"{name} must be a list of token ids (integers)", param=name)
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise InvalidRequestError(
                f"{name} holds token ids outside the vocabulary [0, {self.vocab_size})", param=name
            )

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
        resume_token_ids=(),
    ) -> None:
        """Queue a request. `resume_token_ids` are output tokens already produced elsewhere (a dead
        worker's): generation continues after them and they count toward max_tokens. `lora`: a
        PEFT adapter folder (or a LoRARequest); a bad adapter raises a named AdapterError."""
        if request_id in self.seqs:
            raise DuplicateRequestError(
                f"request {request_id!r} is already in the engine", param="request_id"
            )
        self.validate(prompt_token_ids, params, resume_token_ids)
        if weight <= 0:
            raise InvalidRequestError("weight must be positive", param="weight")
        lora = self._acquire_lora(lora)
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
            # A structured request whose grammar is compiling is held out of the scheduler until it is ready.
            if params.structured is None or self.structured.add(seq):
                self.scheduler.add(
                    seq
                )  # an SLO policy may refuse here (SLOUnattainableError): nothing is kept
        except Exception as exc:
            if params.structured is not None:
                self.structured.release(seq)
            if lora is not None:
                self.lora.release(lora)
            if isinstance(exc, SLOUnattainableError):
                self.stats.slo_refusals += 1
            raise
        self._track(seq, len(resume_token_ids))
        self.seqs[request_id] = seq
        if params.n > 1:
            self._add_choices(seq, lora)

    def _track(self, seq: Sequence, num_resumed: int = 0) -> None:
        """A sequence's own seeded generator and detokenizer state."""
        params, rid = seq.params, seq.request_id
        if params.seed is not None:
            self._generators[rid] = torch.Generator().manual_seed(params.seed)
        if self.detokenizer is not None and (self.config.incremental_text or params.stop):
            self._detok[rid] = self.detokenizer.start(num_resumed)

    def _add_choices(self, first: Sequence, lora) -> None:
        """Choices 1..n-1 of `first`'s request: held until its prompt's KV exists (see _fork)."""
        p = first.params
        rid = first.request_id
        children = []
        for i in range(1, p.n):
            params = replace(p, n=1, prompt_logprobs=None, seed=None if p.seed is None else p.seed + i)
            child = Sequence(
                request_id=f"{rid}#{i}",
                token_ids=list(first.prompt_token_ids),
                num_prompt_tokens=first.num_prompt_tokens,
                params=params,
                tenant=first.tenant,
                weight=first.weight,
                priority=first.priority,
                arrival_time=first.arrival_time,
                tpot_target_s=first.tpot_target_s,
                lora=self._acquire_lora(lora),
                group=rid,
                index=i,
            )
            self._track(child)
            children.append(child)
        self._forks[rid] = children
        self._choices[rid] = [rid] + [c.request_id for c in children]
        self._open[rid] = p.n

    def _fork(self, first: Sequence) -> None:
        """Choice 0 has its first token: its prompt's full blocks are registered in the prefix
        cache, so the other choices start sharing them (each computes only the last partial block)."""
        for child in self._forks.pop(first.request_id, ()):
            self.scheduler.add(child)
            self.seqs[child.request_id] = child

    def _drop_forks(self, request_id: str) -> None:
        """Choices that never started: release what they hold."""
        for child in self._forks.pop(request_id, ()):
            self._release(child)

    def _acquire_lora(self, lora) -> str | None:
        """The adapter's uid (validated, cached in host memory, pinned until the request ends)."""
        if lora is None:
            return None
        if self.lora is None:
            raise LoRADisabledError("this engine serves no LoRA adapters (max_loras=0)", param="lora")
        if isinstance(lora, os.PathLike):
            lora = os.fspath(lora)
        if not isinstance(lora, (str, LoRARequest)):
            raise InvalidRequestError("lora must be an adapter folder path or a LoRARequest", param="lora")
        return self.lora.acquire(lora)

    def check_lora(self, lora) -> None:
        """Validate an adapter (and keep it in the host cache) without queueing anything."""
        uid = self._acquire_lora(lora)
        if uid is not None:
            self.lora.release(uid)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. False if it is unknown or already done."""
        ids = self._choices.pop(request_id, [request_id])  # every choice of an n > 1 request
        self._open.pop(request_id, None)
        self._drop_forks(request_id)
        found = False
        for rid in ids:
            seq = self.seqs.get(rid)
            if seq is not None:
                seq.finish_reason = FinishReason.ABORT
                self._release(seq)
                found = True
        return found

    def take_events(self, request_id: str) -> list:
        """The request's events (SeqEvent) not yet handed out in a RequestOutput: call before
        abort() to keep what happened to an aborted request. Empty if it is unknown."""
        seq = self.seqs.get(request_id)
        return seq.take_events() if seq is not None else []

    # ---- stepping --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once over every scheduled token, sample, and report."""
        compiled = self._admit_compiled() if self._structured is not None and self._structured.held else []
        plan = self.scheduler.schedule()
        self.stats.preemptions += len(plan.preempted)
        if self.lora is not None:  # the adapters of every running sequence into device slots
            self.lora.activate(self.scheduler.running)
            self.stats.lora_slot_loads = self.lora.slots.loads
            self.stats.lora_slot_evictions = self.lora.slots.evictions
        if plan.swap_out or plan.swap_in:  # even when nothing runs: a swapped-out victim's blocks
            t0 = time.perf_counter()
            self.runner.swap(plan)
            self.stats.swap_seconds += time.perf_counter() - t0
            self.stats.swaps += sum(self.block_manager.is_swapped(s) for s in plan.preempted)
            self.stats.swapped_blocks += len(plan.swap_out) + len(plan.swap_in)
        self.stats.slo_refusals += len(plan.refused)
        refused = compiled + [self._refused(seq, error) for seq, error in plan.refused]
        if plan.is_empty:
            return refused
        t0 = time.perf_counter()
        if self._structured is not None:
            self._structured.prepare(plan)  # grammar bitmasks, on a thread, while the forward runs
        sampled = self.runner.run(plan, self._generators, self._structured)
        elapsed = time.perf_counter() - t0
        self.stats.forward_seconds += elapsed
        self.scheduler.observe_step(plan, elapsed)  # feeds an SLO policy's step-cost model
        self.stats.steps += 1
        for item in plan.scheduled:
            if item.is_output_decode:
                self.stats.decode_tokens += 1
            else:
                self.stats.prefill_tokens += item.num_tokens
                item.seq.record("prefill_chunk", tokens=item.num_tokens, start=item.seq.num_computed_tokens)
        stats = self.stats
        stats.admissions = self.scheduler.num_admissions
        stats.last_step_seqs, stats.last_step_tokens = len(plan.scheduled), plan.num_tokens
        stats.last_step_seconds = elapsed
        stats.prefix_hit_tokens = self.block_manager.num_prefix_hit_tokens
        self.scheduler.finish_step(plan)
        self.stats.utilization_sum += self.block_manager.utilization(self.scheduler.running)
        self.stats.utilization_steps += 1
        now = time.monotonic()
        return refused + [self._append(item.seq, token, now, logprob) for item, token, logprob in sampled]

    def _refused(self, seq: Sequence, error: Exception) -> RequestOutput:
        """A waiting request the policy refused (it would miss its TTFT target): finished, no tokens."""
        seq.finish_reason = FinishReason.SLO_UNATTAINABLE
        seq.record("slo_refused")
        self._drop_forks(seq.request_id)
        self._choices.pop(seq.request_id, None)
        self._open.pop(seq.request_id, None)
        self._release(seq)
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=[],
            new_text="",
            finished=True,
            finish_reason=seq.finish_reason.value,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            error=error,
            events=seq.take_events(),
        )

    def _admit_compiled(self) -> list[RequestOutput]:
        """Held structured requests whose grammar has compiled join the scheduler; one whose grammar
        failed, or that an SLO policy refuses now, finishes with its error."""
        if not self.scheduler.has_unfinished():
            self._structured.wait(0.01)  # nothing else to run: no busy loop while a grammar compiles
        outputs = []
        for seq, error in self._structured.take_ready():
            if error is None:
                try:
                    self.scheduler.add(seq)
                    continue
                except SLOUnattainableError as exc:
                    self.stats.slo_refusals += 1
                    outputs.append(self._refused(seq, exc))
                    continue
            seq.finish_reason = FinishReason.ABORT
            seq.status = SequenceStatus.FINISHED  # never in the scheduler
            self._release(seq)
            outputs.append(
                RequestOutput(
                    request_id=seq.request_id,
                    new_token_ids=[],
                    new_text="",
                    finished=True,
                    finish_reason=seq.finish_reason.value,
                    num_prompt_tokens=seq.num_prompt_tokens,
                    num_output_tokens=seq.num_output_tokens,
                    error=error,
                    events=seq.take_events(),
                )
            )
        return outputs

    def predict_ttft(self, num_prompt_tokens: int, priority: int = 0) -> float | None:
        """Predicted seconds to the first token of a request added now; None unless the policy is
        SLO-aware. The gateway refuses at the door with it."""
        return self.scheduler.predict_ttft(num_prompt_tokens, priority)

    def slo_load(self):
        """What predict_ttft reads, as plain numbers (an `SLOLoad`), or None unless the policy is
        SLO-aware: workers publish it so that gateways predict TTFT without the engine."""
        return self.scheduler.slo_load()

    def _append(self, seq: Sequence, token: int, now: float, logprob=None) -> RequestOutput:
        p = seq.params
        if p.max_tokens == 0:  # prompt scoring only: the prefill is done, nothing is generated
            new, logprobs = [], [] if p.logprobs is not None else None
            seq.finish_reason = FinishReason.LENGTH
        else:
            new, logprobs = [token], [logprob] if logprob is not None else None
            seq.token_ids.append(token)
            self.stats.output_tokens += 1
            complete = p.structured is not None and self._structured.accept(
                seq.request_id, token
            )  # grammar done
            if complete or not p.ignore_eos and token in self.eos_token_ids or token in p.stop_token_ids:
                seq.finish_reason = FinishReason.STOP
            elif seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
                seq.finish_reason = FinishReason.LENGTH
        if seq.first_token_time is None:
            seq.first_token_time = now
            seq.record("first_token")
            if seq.request_id in self._forks:
                self._fork(seq)
        text = self._text(seq)
        group = seq.group or seq.request_id
        done = seq.finish_reason is not None
        if group in self._open:  # n > 1: the request is done when its last choice is
            self._open[group] -= done
            done = self._open[group] == 0
            if done:
                del self._open[group], self._choices[group]
        out = RequestOutput(
            request_id=group,
            index=seq.index,
            done=done,
            new_token_ids=new,
            new_text=text,
            finished=seq.finish_reason is not None,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            logprobs=logprobs,
            num_cached_tokens=min(seq.num_cached_tokens, seq.num_prompt_tokens),
        )
        if p.prompt_logprobs is not None and not seq.prompt_logprobs_sent:
            out.prompt_logprobs, seq.prompt_logprobs_sent = seq.prompt_logprobs, True
        if out.finished:
            seq.record("finished", finish_reason=out.finish_reason)
            self._release(seq)
        if seq.events:
            out.events = seq.take_events()
        return out

    def _text(self, seq: Sequence) -> str:
        """New text safe to hand out; detects stop strings (the stop string itself is not emitted)."""
        state = self._detok.get(seq.request_id)
        if state is None:
            return ""
        new = self.detokenizer.step(state, seq.output_token_ids)
        stops = seq.params.stop
        if new and stops:
            cut = find_stop(state.text, len(new), stops)
            if cut != -1:
                state.text = state.text[:cut]
                seq.finish_reason = FinishReason.STOP
        end = len(state.text)
        if seq.finish_reason is None and stops:
            end -= holdback(state.text, stops)
        end = max(end, state.emitted)
        chunk, state.emitted = state.text[state.emitted : end], end
        return chunk

    def _release(self, seq: Sequence) -> None:
        if (
            seq.params.structured is not None
            and self._structured is not None
            and self._structured.release(seq)
        ):
            seq.status = SequenceStatus.FINISHED  # held while its grammar compiled: never in the scheduler
        else:
            self.scheduler.finish(seq)
        if self.seqs.pop(seq.request_id, None) is not None and seq.lora is not None:
            self.lora.release(seq.lora)  # unpin the adapter in host memory
        self._detok.pop(seq.request_id, None)
        self._generators.pop(seq.request_id, None)

    # ---- state -----------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._structured is not None and self._structured.held)

    def has_room(self) -> bool:
        """Would one more request start at the next step? (See Scheduler.has_room.)"""
        return self.scheduler.has_room([s for s in self.seqs.values() if s.status is SequenceStatus.WAITING])

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.block_manager.num_blocks

    @property
    def num_swapped(self) -> int:
        """Waiting sequences whose KV is in host memory (preempted by swap)."""
        return sum(1 for s in self.seqs.values() if self.block_manager.is_swapped(s))

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting


def _releasable_window(spec) -> int:
    """The window out of which a sequence's KV blocks may be released: only where every layer slides
    (a block holds every layer's K/V) and no step recomputes a whole sequence (Phi-3's longrope)."""
    every_layer = all(t == SLIDING for t in spec.layer_types)
    return spec.window if every_layer and spec.window and not spec.long_rope_recompute else 0
