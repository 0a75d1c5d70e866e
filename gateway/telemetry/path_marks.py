"""Timestamps along a request's path, for measuring where a round trip's time goes.

``mark(name)`` appends ``name <time.perf_counter_ns()>`` to the file that ``FAIRLANE_PATH_MARKS``
names, with one ``write`` of an ``O_APPEND`` descriptor, so the gateway and the worker (serve's
children inherit the variable) write to the same file in the order the marks happen; on Linux
``perf_counter_ns`` is CLOCK_MONOTONIC, one clock for every process of the host. Without the
variable (the default) ``mark`` is a function that does nothing.

The marks carry no request id: they are meant for one request at a time (concurrency 1), where
each mark after the client's send belongs to the request in flight. ``benchmarks.path_timeline``
sends such requests and reads the file.

Marks (in a request's order): ``route_in`` (the inference route's handler entered),
``tokenized_in`` / ``tokenized_out`` (the prompt's tokenization on the event loop), ``hinted``
(the admission about to be sent, an early-start hint sent with it where the worker is on this
host), ``worker_hint`` (the worker reads a hint), ``early_step_in`` / ``early_step_out`` (the
hinted request's first engine step), ``admitted`` (the admission's reply back at the gateway),
``worker_entry`` (the worker's read of its lanes returned), ``publish_in`` / ``publish_out`` (the
worker's publish of a step's results), ``results_read`` (the gateway's result reader's read
returned), ``results_in`` (the reader handed a request results: from that read or from an echo),
``first_results`` (the request has its first results), ``route_out`` (the handler
returns its response).
"""

from __future__ import annotations

import os
import time

ENV = "FAIRLANE_PATH_MARKS"


def _writer(path: str):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def mark(name: str) -> None:
        os.write(fd, b"%s %d\n" % (name.encode(), time.perf_counter_ns()))

    return mark


def _nothing(name: str) -> None:
    return None


mark = _writer(os.environ[ENV]) if os.environ.get(ENV) else _nothing


def read(path: str | os.PathLike) -> list[tuple[str, int]]:
    """The marks of a file, in time order: (name, perf_counter_ns)."""
    marks = []
    with open(path) as f:
        for line in f:
            name, _, at = line.strip().partition(" ")
            if at.isdigit():
                marks.append((name, int(at)))
    return sorted(marks, key=lambda m: m[1])
