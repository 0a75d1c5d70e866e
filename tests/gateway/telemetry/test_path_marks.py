"""Path marks: nothing without FAIRLANE_PATH_MARKS; with it, every process appends to one file on
one clock, and serve takes the variable as no setting of its own. (The marks along a served
request's path: the smoke run of benchmarks.path_timeline, which fails when a request misses one.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.settings import UnknownSetting, check_known_keys
from gateway.telemetry import path_marks

REPO = Path(__file__).resolve().parents[3]
MARK = "from gateway.telemetry import path_marks; path_marks.mark({name!r})"


def _run(code: str, env: dict[str, str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True, timeout=60)


def test_without_the_variable_a_mark_does_nothing(tmp_path):
    check = "; assert path_marks.mark is path_marks._nothing"
    _run(MARK.format(name="a") + check, {path_marks.ENV: ""})  # set but empty: off
    assert os.environ.get(path_marks.ENV) is None and path_marks.mark is path_marks._nothing
    assert list(tmp_path.iterdir()) == []


def test_processes_append_to_one_file_in_the_order_of_one_clock(tmp_path):
    target = tmp_path / "marks.txt"
    before = time.perf_counter_ns()
    _run(MARK.format(name="first"), {path_marks.ENV: str(target)})
    _run(MARK.format(name="second") + "; " + MARK.format(name="third"), {path_marks.ENV: str(target)})
    after = time.perf_counter_ns()
    marks = path_marks.read(target)
    assert [name for name, _ in marks] == ["first", "second", "third"]
    assert all(before < at < after for _, at in marks)  # this process's clock: the host's monotonic one


def test_serve_does_not_refuse_the_variable_as_an_unknown_setting(tmp_path):
    config = tmp_path / "fairlane.yaml"
    config.write_text("{}\n")
    check_known_keys({path_marks.ENV: str(tmp_path / "marks.txt")}, path=config)
    # a near name is still refused
    with pytest.raises(UnknownSetting, match="unknown setting FAIRLANE_PATH_MARK;"):
        check_known_keys({"FAIRLANE_PATH_MARK": "x"}, path=config)
