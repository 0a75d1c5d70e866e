"""The thread policy of `fairlane serve`'s engine workers, which share the host with the gateway,
the embedded Redis and often the client.

Two settings, each applied only where the operator left it unset:

- `engine.num_threads` (FAIRLANE_ENGINE__NUM_THREADS): the usable cores less one (left to the
  gateway and Redis), split among the workers, at least 1. With as many engine threads as cores, a
  step's parallel regions wait at every barrier for the thread the OS gave to the gateway: on a
  2-core host, 16 streamed chats ran at about half the output tokens per second of one thread.
- OMP_WAIT_POLICY=PASSIVE: an OpenMP thread with nothing to do sleeps instead of spinning for
  the cores the gateway needs. OpenMP reads it once, when its runtime loads (with torch), so it is
  set in the worker's environment before the process starts.

docs/performance.md ("Threads on a shared host") gives the measurements.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

WAIT_POLICY = "PASSIVE"
THREADS_ENV = "FAIRLANE_ENGINE__NUM_THREADS"


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask, as a container's cpuset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def engine_threads(workers: int, cpus: int) -> int:
    """Threads per engine worker: the cores less one for the gateway, split among the workers."""
    return max(1, (cpus - 1) // max(workers, 1))


def worker_env(
    environ: Mapping[str, str], num_threads: int | None, workers: int, cpus: int | None = None
) -> dict[str, str]:
    """The variables to add to a worker's environment: what `environ` and the settings
    (`num_threads`, from env or YAML) leave unset."""
    extra = {}
    if "OMP_WAIT_POLICY" not in environ:
        extra["OMP_WAIT_POLICY"] = WAIT_POLICY
    if num_threads is None and THREADS_ENV not in environ:
        extra[THREADS_ENV] = str(engine_threads(workers, usable_cpus() if cpus is None else cpus))
    return extra
