"""What ``fairlane serve`` starts, kept running: child processes restarted with backoff when they die.

One thread watches every child (every ``POLL_S``). A child that exits while serve runs is started
again after a backoff that doubles from ``first_backoff_s`` up to ``max_backoff_s`` and goes back
to the first once a child has lived ``stable_s``. ``crash_loop_restarts`` restarts within
``crash_loop_window_s`` mark the child as in a crash loop: logged, and shown by ``/ready``.

Children are spawned from this thread, each in its own process group (a terminal's Ctrl-C reaches
serve only, which drains before it stops them) and with the parent-death signal set to SIGTERM
(Linux): if serve itself is killed, its children go with it instead of running on as orphans.
``stop`` ends them in the reverse order of ``add`` (workers before the Redis they use).
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

log = logging.getLogger("fairlane.serve")
POLL_S = 0.2
STOP_TIMEOUT_S = 10.0  # a child still running this long after SIGTERM is killed
PR_SET_PDEATHSIG = 1


def child_setup() -> None:
    """preexec_fn of every child: die with the thread that started it (Linux only)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    spawn: Callable[[], subprocess.Popen]  # start the process (called from the supervisor thread)
    first_backoff_s: float
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 0.0
    due_at: float | None = None  # when a dead child is started again
    last_exit: int | None = None
    exits: deque = field(default_factory=deque)  # monotonic times of recent exits
    stop_timeout_s: float = STOP_TIMEOUT_S  # how long it may take to stop after SIGTERM
    stop_by: float | None = None  # once told to stop: when it is killed if still running

    def state(self, crash_loop_restarts: int) -> str:
        if self.due_at is not None:
            return "crash_loop" if len(self.exits) >= crash_loop_restarts else "restarting"
        return "running" if self.process is not None and self.process.poll() is None else "starting"


class Supervisor:
    """Starts children, restarts the ones that die, stops them all in order."""

    def __init__(
        self,
        *,
        max_backoff_s: float = 30.0,
        stable_s: float = 60.0,
        crash_loop_restarts: int = 3,
        crash_loop_window_s: float = 120.0,
        on_exit: Callable[[str, int], None] | None = None,
    ) -> None:
        """``on_exit(name, pid)`` runs (on the supervisor thread) for every child that exited."""
        self.max_backoff_s, self.stable_s = max_backoff_s, stable_s
        self.on_exit = on_exit
        self.crash_loop_restarts, self.crash_loop_window_s = crash_loop_restarts, crash_loop_window_s
        self.children: list[Child] = []
        self._lock = threading.RLock()  # stop_now may run in a signal handler of a thread holding it
        self._todo: deque[Child] = deque()  # added, not started yet
        self._started = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fairlane-supervisor", daemon=True)

    def add(
        self,
        name: str,
        spawn: Callable[[], subprocess.Popen],
        *,
        first_backoff_s: float = 1.0,
        wait: bool = True,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> Child:
        """Start a child (from the supervisor thread) and keep it running; ``wait``: until spawned;
        ``stop_timeout_s``: how long it may take to stop after SIGTERM before it is killed."""
        child = Child(name, spawn, first_backoff_s, stop_timeout_s=stop_timeout_s)
        with self._lock:
            self.children.append(child)
            self._todo.append(child)
        if not self._thread.is_alive():
            self._thread.start()
        while wait and child.process is None and child.due_at is None and self._thread.is_alive():
            time.sleep(0.02)
        return child

    def status(self) -> dict[str, dict]:
        """name → state (running, starting, restarting, crash_loop), pid, restarts, last exit code."""
        with self._lock:
            return {
                c.name: {
                    "state": c.state(self.crash_loop_restarts),
                    "pid": c.process.pid if c.process is not None else None,
                    "restarts": c.restarts,
                    "last_exit": c.last_exit,
                }
                for c in self.children
            }

    def healthy(self) -> bool:
        return all(s["state"] != "crash_loop" for s in self.status().values())

    def stop_now(self, names: Collection[str]) -> None:
        """SIGTERM these children now and restart them no more (serve's other gateway processes,
        which drain together with the first); ``stop`` waits for them, each its stop_timeout_s
        from now."""
        with self._lock:
            for child in self.children:
                if child.name in names and child.stop_by is None:
                    self._terminate(child)

    def _terminate(self, child: Child) -> None:
        child.stop_by = time.monotonic() + child.stop_timeout_s
        if child.process is not None and child.process.poll() is None:
            child.process.terminate()

    def stop(self) -> None:
        """Stop watching, then end the children in reverse order (SIGTERM, SIGKILL after a while)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._stopped.wait()
        else:
            self._shutdown()

    # ---- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                with self._lock:
                    todo, self._todo = list(self._todo), deque()
                for child in todo:
                    self._start(child)
                self._watch()
                self._stopping.wait(POLL_S)
        finally:
            self._shutdown()  # from this thread: the parent-death signal would end the children anyway
            self._stopped.set()

    def _start(self, child: Child) -> None:
        try:
            process = child.spawn()
        except Exception as exc:  # a spawn that fails counts as an exit: retried with backoff
            log.error("%s could not start: %s", child.name, exc)
            self._exited(child, None, time.monotonic())
            return
        with self._lock:
            child.process, child.started_at, child.due_at = process, time.monotonic(), None

    def _watch(self) -> None:
        now = time.monotonic()
        for child in list(self.children):
            if child.stop_by is not None:  # told to stop: not restarted
                continue
            if child.due_at is not None:
                if now >= child.due_at:
                    child.restarts += 1
                    log.warning("restarting %s (restart %d)", child.name, child.restarts)
                    self._start(child)
                continue
            if child.process is None or child.process.poll() is None:
                continue
            self._exited(child, child.process.returncode, now)

    def _exited(self, child: Child, code: int | None, now: float) -> None:
        if child.process is not None and self.on_exit is not None:
            try:
                self.on_exit(child.name, child.process.pid)
            except Exception:  # a failing hook must not stop the restarts
                log.exception("on_exit hook for %s failed", child.name)
        if child.process is not None and now - child.started_at >= self.stable_s:
            child.backoff_s = 0.0  # it had been running fine: a fresh start
        child.backoff_s = (
            child.first_backoff_s if not child.backoff_s else min(child.backoff_s * 2, self.max_backoff_s)
        )
        while child.exits and now - child.exits[0] > self.crash_loop_window_s:
            child.exits.popleft()
        child.exits.append(now)
        with self._lock:
            child.process, child.last_exit, child.due_at = None, code, now + child.backoff_s
        state = child.state(self.crash_loop_restarts)
        log.log(
            logging.WARNING if code == 0 else logging.ERROR,  # 0: stopped cleanly by someone else
            "%s exited with code %s; restarting in %.1f s%s",
            child.name,
            code,
            child.backoff_s,
            f" (crash loop: {len(child.exits)} exits in {self.crash_loop_window_s:.0f} s)"
            if state == "crash_loop"
            else "",
        )

    def _shutdown(self) -> None:
        for child in reversed(self.children):
            process = child.process
            if process is None or process.poll() is not None:
                continue
            if child.stop_by is None:
                self._terminate(child)
            assert child.stop_by is not None
            try:
                process.wait(timeout=max(0.0, child.stop_by - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s; killing it", child.name, child.stop_timeout_s)
                process.kill()
                process.wait()
