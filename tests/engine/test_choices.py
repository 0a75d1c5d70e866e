"""n > 1 bookkeeping (engine/choices.py) over a real scheduler and request table: plain Python, no
model. The token-level behaviour of choices is tests/engine/test_n_choices.py."""

from engine.block_manager import BlockManager
from engine.choices import Choices, later_choices
from engine.config import SchedulerConfig
from engine.request import FinishReason, SamplingParams, Sequence
from engine.request_table import RequestTable
from engine.scheduler import Scheduler


def setup(n: int, seed: int | None = 5) -> tuple[RequestTable, Choices, Scheduler, Sequence, list[Sequence]]:
    scheduler = Scheduler(SchedulerConfig(block_size=4, watermark=0), BlockManager(16, 4))
    requests = RequestTable()
    choices = Choices(requests, scheduler)
    first = Sequence("r", [1, 2, 3, 4, 5], 5, SamplingParams(n=n, seed=seed, prompt_logprobs=1))
    scheduler.add(first)
    requests.add(first)
    pins = iter(["uid-1", "uid-2", "uid-3"])
    later = later_choices(first, lambda: next(pins))
    choices.add(first, later)
    return requests, choices, scheduler, first, later


def test_later_choices_copy_the_prompt_with_their_own_ids_and_seeds():
    _, _, _, first, later = setup(n=3)
    assert [c.request_id for c in later] == ["r#1", "r#2"] and [c.index for c in later] == [1, 2]
    assert all(c.group == "r" and c.token_ids == first.prompt_token_ids for c in later)
    assert [c.params.seed for c in later] == [6, 7] and all(c.params.n == 1 for c in later)
    assert all(c.params.prompt_logprobs is None for c in later)  # only choice 0 reports them
    assert [c.lora for c in later] == ["uid-1", "uid-2"]  # each pins the adapter again
    assert later_choices(setup(n=2, seed=None)[3], lambda: None)[0].params.seed is None


def test_later_choices_start_with_choice_0s_first_token_and_the_last_one_ends_the_request():
    requests, choices, scheduler, first, later = setup(n=3)
    assert requests.choice_ids["r"] == ["r", "r#1", "r#2"] and requests.open_choices["r"] == 3
    assert "r#1" not in requests and scheduler.num_waiting == 1
    choices.start(first)
    assert "r#1" in requests and "r#2" in requests and scheduler.num_waiting == 3
    assert not requests.unstarted_choices
    choices.start(first)  # a second first token (never happens) starts nothing twice
    assert scheduler.num_waiting == 3
    assert choices.finish(later[0]) is False  # not finished: nothing changes
    later[0].finish_reason = FinishReason.STOP
    assert choices.finish(later[0]) is False and requests.open_choices["r"] == 2
    first.finish_reason = later[1].finish_reason = FinishReason.LENGTH
    assert choices.finish(first) is False
    assert choices.finish(later[1]) is True  # the last choice: the request is over
    assert not requests.open_choices and not requests.choice_ids


def test_ending_a_request_early_names_its_choices_and_those_never_started():
    requests, choices, _, _, later = setup(n=3)
    seq_ids, unstarted = choices.end("r")
    assert seq_ids == ["r", "r#1", "r#2"] and unstarted == later
    assert not requests.unstarted_choices and not requests.choice_ids and not requests.open_choices
    assert choices.end("unknown") == (["unknown"], [])  # n == 1 or unknown: just its own id
