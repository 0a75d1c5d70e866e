"""The supervisor restarts a child that dies and tells its ``on_exit`` hook which process ended;
``fairlane serve`` uses the hook to drop a dead worker's live gauges from the metrics scrape."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from gateway.cli.supervisor import Supervisor


def test_a_dead_child_is_restarted_and_reported_to_the_exit_hook():
    exits: list[tuple[str, int]] = []
    pids: list[int] = []

    def spawn() -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
        pids.append(process.pid)
        return process

    supervisor = Supervisor(on_exit=lambda name, pid: exits.append((name, pid)))
    supervisor.add("crasher", spawn, first_backoff_s=0.05)
    deadline = time.monotonic() + 20
    while len(exits) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    supervisor.stop()
    assert len(exits) >= 2, exits
    assert [name for name, _ in exits] == ["crasher"] * len(exits)
    assert [pid for _, pid in exits] == pids[: len(exits)]  # each exit names the process that ended
    assert supervisor.status()["crasher"]["restarts"] >= 1
    assert supervisor.status()["crasher"]["last_exit"] == 3


def test_a_failing_exit_hook_does_not_stop_the_restarts():
    calls: list[int] = []

    def hook(name: str, pid: int) -> None:
        calls.append(pid)
        raise RuntimeError("hook failed")

    supervisor = Supervisor(on_exit=hook)
    supervisor.add("crasher", lambda: subprocess.Popen([sys.executable, "-c", "pass"]), first_backoff_s=0.05)
    deadline = time.monotonic() + 20
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    supervisor.stop()
    assert len(calls) >= 2


def test_forget_process_drops_a_dead_workers_live_gauges(tmp_path):
    """A worker's running-sequence gauge counts while it lives; once the process is forgotten the
    scrape no longer sums it (counters would stay)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    code = textwrap.dedent("""
        from prometheus_client import Gauge
        g = Gauge("fairlane_test_running", "running", multiprocess_mode="livesum")
        g.set(5)
        import os; print(os.getpid())
    """)
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    pid = int(child.stdout.strip())

    def scraped() -> float:
        probe = textwrap.dedent("""
            import sys
            from prometheus_client import CollectorRegistry, generate_latest, multiprocess
            from gateway.telemetry import multiproc
            if len(sys.argv) > 1:
                multiproc.forget_process(int(sys.argv[1]))
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            print(generate_latest(registry).decode())
        """)
        args = [sys.executable, "-c", probe] + ([str(pid)] if forget else [])
        out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
        values = [
            float(line.split()[-1]) for line in out.splitlines() if line.startswith("fairlane_test_running ")
        ]
        return sum(values)

    forget = False
    assert scraped() == 5.0
    forget = True
    assert scraped() == 0.0
