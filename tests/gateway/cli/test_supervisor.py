"""The supervisor restarts a child that dies and tells its ``on_exit`` hook which process ended;
``fairlane serve`` uses the hook to drop a dead worker's live gauges from the metrics scrape."""

from __future__ import annotations

import logging
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


def test_a_clean_exit_is_a_warning_and_a_failure_an_error(caplog):
    """A child that exits 0 unasked (stopped by someone else, e.g. a SIGTERM it handled) is
    restarted with a warning; a failing one is an error."""
    for code, level in ((0, logging.WARNING), (3, logging.ERROR)):
        supervisor = Supervisor()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fairlane"):
            supervisor.add(
                "child",
                lambda code=code: subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"]),
            )
            deadline = time.monotonic() + 20
            while not supervisor.status()["child"]["restarts"] and time.monotonic() < deadline:
                time.sleep(0.05)
            supervisor.stop()
        exits = [r for r in caplog.records if f"exited with code {code}" in r.getMessage()]
        assert exits and all(r.levelno == level for r in exits), (code, exits)


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


SLOW_STOP = textwrap.dedent("""
    import signal, sys, time
    def drain(*_):
        time.sleep(1.0)  # in-flight requests finishing
        sys.exit(0)
    signal.signal(signal.SIGTERM, drain)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
""")


def _slow_stopper(processes: list[subprocess.Popen]):
    def spawn() -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", SLOW_STOP], stdout=subprocess.PIPE, text=True)
        processes.append(process)
        return process

    return spawn


def _started(processes: list[subprocess.Popen]) -> subprocess.Popen:
    deadline = time.monotonic() + 20
    while not processes and time.monotonic() < deadline:
        time.sleep(0.02)
    assert processes[0].stdout is not None and processes[0].stdout.readline() == "ready\n"
    return processes[0]


def test_a_child_gets_its_own_stop_timeout_before_it_is_killed():
    """A child that needs 1 s to stop after SIGTERM: given 5 s it exits by itself; given 0.2 s, killed."""
    patient, hasty = [], []
    supervisor = Supervisor()
    supervisor.add("patient", _slow_stopper(patient), stop_timeout_s=5.0)
    supervisor.add("hasty", _slow_stopper(hasty), stop_timeout_s=0.2)
    _started(patient), _started(hasty)
    supervisor.stop()
    assert patient[0].returncode == 0
    assert hasty[0].returncode == -9


def test_stop_now_terminates_at_once_restarts_no_more_and_stop_waits_for_it():
    processes: list[subprocess.Popen] = []
    supervisor = Supervisor()
    supervisor.add("gateway-1", _slow_stopper(processes), first_backoff_s=0.05, stop_timeout_s=5.0)
    process = _started(processes)
    told = time.monotonic()
    supervisor.stop_now(["gateway-1"])
    process.wait(timeout=10)
    assert time.monotonic() - told < 5  # stopped by the SIGTERM of stop_now, not by stop()
    time.sleep(0.3)  # several supervisor polls: an exit after stop_now is not restarted
    assert len(processes) == 1
    supervisor.stop()
    assert process.returncode == 0 and supervisor.status()["gateway-1"]["restarts"] == 0
