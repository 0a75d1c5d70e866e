"""The suite's schedule (tests/conftest.py): a durations report is read into seconds per xdist group."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from group_seconds import group_seconds  # noqa: E402

REPORT = """============================ slowest 5 durations =============================
121.37s call     tests/gateway/cli/test_cluster_e2e.py::test_200_streams@tests/gateway/cli/test_cluster_e2e.py
12.11s setup    tests/gateway/cli/test_cluster_e2e.py::test_200_streams@tests/gateway/cli/test_cluster_e2e.py
46.62s call     tests/benchmarks/test_smoke.py::test_smoke[scheduling-options31]@benchmark-scheduling--http
15.23s call     tests/gateway/api/test_x.py::test_y@smollm2-fp32-server
3.00s call     tests/engine/test_plain.py::test_z
"""


def test_seconds_are_summed_per_group_longest_first():
    seconds = group_seconds(REPORT)
    assert seconds == {
        "tests/gateway/cli/test_cluster_e2e.py": 133.5,
        "benchmark-scheduling--http": 46.6,
        "smollm2-fp32-server": 15.2,
    }
    assert list(seconds) == sorted(seconds, key=lambda g: -seconds[g])
