"""The result line of a runner from another environment is found among its libraries' output; a
run names the machine it ran on as lscpu does."""

import re
import subprocess

import pytest

from benchmarks.common import ISA_FLAGS, machine, result_line


def test_the_last_result_line_wins_over_logs_after_it():
    out = 'INFO starting\nRESULT {"seconds": 1.5}\nINFO [shutdown] workers exited\n{"not": "ours"}\n'
    assert result_line(out) == {"seconds": 1.5}


def test_no_result_line_is_an_error_showing_the_output():
    with pytest.raises(RuntimeError, match="INFO only logs"):
        result_line("INFO only logs\n")


def test_machine_names_the_cpu_as_lscpu_does():
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    got = machine()
    assert got["cpu"] == re.search(r"^Model name:\s*(.+)$", lscpu, re.M).group(1).strip()
    assert got["cpu_family"] == re.search(r"^CPU family:\s*(\S+)", lscpu, re.M).group(1)
    assert got["cpu_model"] == re.search(r"^Model:\s*(\S+)", lscpu, re.M).group(1)
    flags = set(re.search(r"^Flags:(.*)$", lscpu, re.M).group(1).split())
    assert got["isa"] == [f for f in ISA_FLAGS if f in flags]
    assert got["cpus"] >= 1 and re.fullmatch(r"\d{4}-\d\d-\d\d", got["date"])
