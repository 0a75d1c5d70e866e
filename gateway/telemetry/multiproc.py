"""prometheus_client's multiprocess mode for ``fairlane serve``: one scrape of the gateway's
/metrics covers the gateway and every worker it started.

Why this and not workers pushing their gauges to Redis for the gateway to render: counters and
histograms stay exact per process with no protocol of our own (each process writes its own
memory-mapped files; the scrape sums them), nothing is double counted when several gateway
replicas are scraped (a replica reports only the processes of its own ``fairlane serve``), and a
worker on another machine is simply scraped on its own port. The price: the directory must exist
before prometheus_client is imported in the processes that use it, so ``fairlane serve`` calls
``begin()`` before it imports the app, and its workers inherit the variable.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def begin() -> str | None:
    """Create a fresh directory and point this process (and its children) at it; returns it, or
    None when the variable was already set (the operator's directory: left as it is)."""
    if os.environ.get(MULTIPROC_ENV):
        return None
    if "gateway.telemetry.metrics" in sys.modules:
        raise RuntimeError("metrics were defined before multiprocess mode was set up")
    path = tempfile.mkdtemp(prefix="fairlane-metrics-")
    os.environ[MULTIPROC_ENV] = path
    if "prometheus_client.values" in sys.modules:  # imported by a library: pick the multiprocess values
        from prometheus_client import values

        values.ValueClass = values.get_value_class()
    return path


def forget_process(pid: int) -> None:
    """A process (a worker) exited: drop its live gauges (its counters stay in the totals)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def end(path: str | None) -> None:
    """Remove the directory ``begin`` made (at exit)."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        if os.environ.get(MULTIPROC_ENV) == path:
            del os.environ[MULTIPROC_ENV]
