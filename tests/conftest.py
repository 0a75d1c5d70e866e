"""The suite under pytest-xdist (the README's test command: ``-n 2 --dist loadgroup``): every test
without an ``xdist_group`` mark is put in its file's group, so a file runs on one worker and its
module-scoped servers start once; files that share a package-scoped server carry one group mark
and run on the same worker. Without xdist the marks change nothing."""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers share the cores, and engine tests ask for two threads each: OpenMP threads that spin in
    # their barriers then take each other's cores for whole time slices. A passive wait (what `fairlane
    # serve` gives its workers, gateway/cli/threads.py) sleeps instead. Set before any test module loads
    # torch; the servers the tests start inherit it.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
