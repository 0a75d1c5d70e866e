"""Compiled grammars by spec: a bounded LRU of futures, compiled on a background thread.

A spec seen before is a hit (its future may still be running: a second request waits on the same
compilation). Compiling a large JSON schema against a 49k-token vocabulary takes tens of ms to
seconds, so it never runs on the engine's step loop."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from engine.structured.spec import StructuredSpec

DEFAULT_CAPACITY = 128  # compiled grammars kept (a JSON schema's is ~10-100 KB on a 49k vocabulary)


class GrammarCache:
    def __init__(
        self,
        compile_fn: Callable[[StructuredSpec], Any],
        capacity: int = DEFAULT_CAPACITY,
        executor: ThreadPoolExecutor | None = None,
    ):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._compile = compile_fn
        self.capacity = capacity
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._entries: OrderedDict[StructuredSpec, Future] = OrderedDict()
        self._lock = threading.Lock()  # a failed compile is forgotten from the compile thread
        self.hits = 0
        self.misses = 0

    def get(self, spec: StructuredSpec) -> Future:
        """The spec's compiled grammar, as a future (done at once on a hit of a finished compile)."""
        with self._lock:
            future = self._entries.get(spec)
            if future is not None and not _failed(future):
                self._entries.move_to_end(spec)
                self.hits += 1
                return future
            self.misses += 1
            future = self._executor.submit(self._compile, spec)
            self._entries[spec] = future
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)  # the least recently used; a waiter keeps its own future
        future.add_done_callback(partial(self._forget_failed, spec))
        return future

    def _forget_failed(self, spec: StructuredSpec, future: Future) -> None:
        if _failed(future):
            with self._lock:
                if self._entries.get(spec) is future:
                    self._entries.pop(spec, None)  # not cached: the next request compiles (and fails) again

    def __contains__(self, spec: StructuredSpec) -> bool:
        """Cached (compiled or compiling), not failed."""
        future = self._entries.get(spec)
        return future is not None and not _failed(future)

    def __len__(self) -> int:
        return len(self._entries)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _failed(future: Future) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)
