"""The result line of a runner from another environment is found among its libraries' output."""

import pytest

from benchmarks.common import result_line


def test_the_last_result_line_wins_over_logs_after_it():
    out = 'INFO starting\nRESULT {"seconds": 1.5}\nINFO [shutdown] workers exited\n{"not": "ours"}\n'
    assert result_line(out) == {"seconds": 1.5}


def test_no_result_line_is_an_error_showing_the_output():
    with pytest.raises(RuntimeError, match="INFO only logs"):
        result_line("INFO only logs\n")
