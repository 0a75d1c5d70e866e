"""The end of a command's process (serve, a worker, a gateway process, generate, a benchmark)."""

from __future__ import annotations

import gc
import sys


def prepare_exit() -> None:
    """Every object into the collector's permanent generation, so the collections of the interpreter's
    shutdown walk none of them (a second or more for a process holding the web stack or torch, on a
    busy machine); the system takes the memory back at exit. Not with triton loaded: its nanobind
    bindings would report the objects still alive at exit as leaks."""
    if "triton" not in sys.modules:
        gc.freeze()
