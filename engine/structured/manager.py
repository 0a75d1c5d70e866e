"""Grammar-constrained decoding inside the engine: one GrammarMatcher per structured sequence, the
token bitmask of every constrained row filled each step and applied to the logits before sampling.

Lifecycle of a structured sequence: ``add`` at add_request (a cached grammar: its matcher at once;
else it waits out of the scheduler while a thread compiles the grammar, and ``take_ready`` hands it
to the scheduler at a later step);
``prepare`` at the step start fills the bitmask rows of the constrained sequences that sample, on a
thread, while the forward runs; ``apply`` masks the logits [S, V] before the sampler; ``accept``
advances the matcher with the sampled token; ``release`` at the end. The matcher is keyed by
request id, not by KV blocks: preemption (recompute or swap) leaves it as it is, since the tokens
do not change. A sequence resumed from tokens generated elsewhere has its matcher rebuilt by
accepting them. Rows without a grammar cost nothing: with no matcher in the step, both calls return
at once."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from engine.errors import InvalidRequestError
from engine.request import Sequence
from engine.scheduler import ScheduledSeq, StepPlan
from engine.structured.cache import DEFAULT_CAPACITY, GrammarCache
from engine.structured.grammar import to_grammar
from engine.structured.spec import PARAM, StructuredSpec

log = logging.getLogger(__name__)


class StructuredOutputs:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        *,
        capacity: int = DEFAULT_CAPACITY,
        max_threads: int | None = None,
    ):
        # vocab_size: the model's (the logits' width), which may exceed the tokenizer's; the ids
        # past the tokenizer's are never allowed by a grammar.
        self.vocab_size = vocab_size
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids)
        )
        threads = max_threads or min(4, os.cpu_count() or 1)
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=threads, cache_enabled=False)
        self.cache = GrammarCache(self._compile, capacity)
        self.matchers: dict[str, xgr.GrammarMatcher] = {}
        # request id -> its grammar's compilation, for sequences kept out of the scheduler until it ends
        self.compiling: dict[str, Future] = {}
        self._batch = xgr.BatchGrammarMatcher(max_threads=threads)
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self._bitmask = xgr.allocate_token_bitmask(
            1, vocab_size
        )  # [rows, ceil(V / 32)] int32, grown on demand
        self._fill: tuple[dict[str, int], torch.Tensor, Future] | None = None

    def _compile(self, spec: StructuredSpec) -> xgr.CompiledGrammar:
        return self.compiler.compile_grammar(to_grammar(spec))

    # ---- admission ------------------------------------------------------------------------
    def add(self, seq: Sequence) -> bool:
        """Start a structured sequence: True when its matcher is ready (the grammar was cached), False
        when it waits for its grammar to compile (see take_ready). InvalidRequestError if its
        grammar cannot be used."""
        spec = seq.params.structured
        assert spec is not None, "a sequence without a structured spec"
        future = self.cache.get(spec)
        if future.done():
            self._start(seq, future)
            return True
        self.compiling[seq.request_id] = future
        return False

    @property
    def held(self) -> dict[str, Future]:
        """The requests kept out of the scheduler while their grammar compiles (`compiling`)."""
        return self.compiling

    def take_ready(self, seqs: Mapping[str, Sequence]) -> list[tuple[Sequence, Exception | None]]:
        """Waiting sequences (looked up in `seqs`, by request id) whose grammar finished compiling,
        with their matchers made; the error instead for one whose grammar failed."""
        ready: list[tuple[Sequence, Exception | None]] = []
        for request_id, future in list(self.compiling.items()):
            if future.done():
                del self.compiling[request_id]
                seq = seqs[request_id]
                try:
                    self._start(seq, future)
                    ready.append((seq, None))
                except InvalidRequestError as exc:
                    ready.append((seq, exc))
        return ready

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for one waiting sequence's grammar (when nothing else can run)."""
        if self.compiling:
            wait(list(self.compiling.values()), timeout=timeout, return_when=FIRST_COMPLETED)

    def _start(self, seq: Sequence, future: Future) -> None:
        try:
            compiled = future.result()
        except InvalidRequestError:
            raise
        except Exception as exc:
            spec = seq.params.structured
            kind, param = (spec.kind, spec.param) if spec is not None else ("structured", PARAM)
            raise InvalidRequestError(
                f"the {kind} constraint cannot be compiled: {exc}", param=param
            ) from exc
        matcher = xgr.GrammarMatcher(compiled)
        for token in seq.output_token_ids:  # resumed: the tokens a dead worker already generated
            if not matcher.accept_token(token):
                raise InvalidRequestError(
                    "the resumed output does not match the grammar", param="resume_token_ids"
                )
        self.matchers[seq.request_id] = matcher

    def release(self, seq: Sequence) -> bool:
        """Forget a finished or aborted sequence; True if it still waited for its grammar (never
        scheduled)."""
        self.matchers.pop(seq.request_id, None)
        return self.compiling.pop(seq.request_id, None) is not None

    # ---- every step ------------------------------------------------------------------------
    def prepare(self, plan: StepPlan) -> None:
        """Start filling the bitmask rows of the plan's constrained sequences that sample, on a
        thread: it runs while the forward does."""
        self._fill = None
        if not self.matchers:
            return
        rows: dict[str, int] = {}
        matchers: list[xgr.GrammarMatcher] = []
        for item in plan.scheduled:
            matcher = self.matchers.get(item.seq.request_id)
            if matcher is not None and item.samples:
                rows[item.seq.request_id] = len(matchers)
                matchers.append(matcher)
        if not matchers:
            return
        if self._bitmask.shape[0] < len(matchers):
            self._bitmask = xgr.allocate_token_bitmask(
                max(len(matchers), 2 * self._bitmask.shape[0]), self.vocab_size
            )
        bitmask = self._bitmask[: len(matchers)]
        self._fill = (
            rows,
            bitmask,
            self._filler.submit(self._batch.batch_fill_next_token_bitmask, matchers, bitmask),
        )

    def apply(self, logits: torch.Tensor, samplers: list[ScheduledSeq]) -> None:
        """Set to -inf, in place, the logits [S, V] of tokens that a row's grammar does not allow
        next (S: the sampling items, in `samplers` order)."""
        if self._fill is None:
            return
        rows, bitmask, future = self._fill
        self._fill = None
        future.result()
        index = [(i, rows[it.seq.request_id]) for i, it in enumerate(samplers) if it.seq.request_id in rows]
        if not index:
            return
        dst, src = (list(x) for x in zip(*index))
        if logits.device.type == "cpu" and sys.byteorder == "little":
            _mask_cpu(logits, bitmask, dst, src)
            return
        full = torch.full((logits.shape[0], bitmask.shape[1]), -1, dtype=torch.int32)  # -1: all allowed
        full[dst] = bitmask[src]
        xgr.apply_token_bitmask_inplace(
            logits, full.to(logits.device), vocab_size=self.vocab_size, indices=dst
        )

    def accept(self, request_id: str, token: int) -> bool:
        """Advance the sequence's matcher by its sampled token; True when the output is complete
        (the grammar accepted a stop token), so the sequence stops."""
        matcher = self.matchers.get(request_id)
        if matcher is None:
            return False
        if not matcher.accept_token(token):  # cannot happen with the mask applied; stop rather than go astray
            log.error("request %s: the grammar rejected sampled token %d; stopping it", request_id, token)
            return True
        return matcher.is_terminated()

    def close(self) -> None:
        self.cache.shutdown()
        self._filler.shutdown(wait=False, cancel_futures=True)


def _mask_cpu(logits: torch.Tensor, bitmask: torch.Tensor, dst: list[int], src: list[int]) -> None:
    """logits[dst[i]] = -inf where bitmask row src[i] has a 0 bit. The bits are unpacked by numpy
    (bit j of int32 word w is token 32 * w + j: little-endian bytes, little bit order) and the fill
    is one masked_fill_ on torch's threads: several times faster on CPU than xgrammar's
    one-thread kernel at 32 rows x 49,152 tokens."""
    vocab = logits.shape[1]
    words = (~bitmask[src]).numpy()  # [R, ceil(V / 32)] int32, 1 bits: forbidden
    forbidden = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")[:, :vocab].view(
        np.bool_
    )  # [R, V]
    if dst != list(range(logits.shape[0])):  # some rows unconstrained: they stay as they are
        rows = np.zeros((logits.shape[0], vocab), dtype=np.bool_)
        rows[dst] = forbidden
        forbidden = rows
    logits.masked_fill_(torch.from_numpy(forbidden), float("-inf"))


def for_engine(tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> StructuredOutputs:
    """The engine's StructuredOutputs; InvalidRequestError for a model without a tokenizer."""
    if tokenizer is None:
        raise InvalidRequestError("structured outputs need a model with a tokenizer", param=PARAM)
    return StructuredOutputs(tokenizer, vocab_size, eos_token_ids)
