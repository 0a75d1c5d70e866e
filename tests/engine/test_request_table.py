"""The request table (engine/request_table.py): plain Python, no model."""

from engine.request import SamplingParams, Sequence, SequenceStatus
from engine.request_table import RequestTable


def test_the_table_forgets_what_it_held_for_a_sequence():
    requests = RequestTable()
    seq = Sequence("a", [1, 2], 2, SamplingParams())
    requests.add(seq)
    requests.track("a", None, None)  # neither text nor a seed: nothing kept
    assert "a" in requests and not requests.text_states and not requests.generators
    assert requests.waiting() == [seq]
    seq.status = SequenceStatus.RUNNING
    assert requests.waiting() == []
    assert requests.forget(seq) is True and requests.get("a") is None
    assert requests.forget(seq) is False  # already gone
