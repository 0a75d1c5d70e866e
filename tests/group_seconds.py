"""Writes tests/group_seconds.json, the seconds each xdist group of the suite took, from the
``--durations`` report of a run under the README's test command:

    python3 -m pytest -q -n 2 --dist loadgroup --durations=300 | python3 tests/group_seconds.py

tests/conftest.py hands the groups to the workers longest first, so that the two workers finish
together instead of one running a long file alone at the end."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"^([0-9.]+)s (?:setup|call|teardown)\s+(\S+)$")


def group_seconds(report: str) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for line in report.splitlines():
        match = LINE.match(line.strip())
        if match and "@" in match[2]:
            group = match[2].rsplit("@", 1)[1]
            seconds[group] = round(seconds.get(group, 0.0) + float(match[1]), 1)
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    found = group_seconds(sys.stdin.read())
    if not found:
        sys.exit("no durations with xdist groups in the input (run with -n 2 --dist loadgroup --durations=N)")
    (Path(__file__).parent / "group_seconds.json").write_text(json.dumps(found, indent=1) + "\n")
    print(f"{len(found)} groups, {sum(found.values()):.0f} s")
