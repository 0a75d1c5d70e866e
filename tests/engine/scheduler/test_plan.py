"""The one definition of a decode (ScheduledSeq.is_decode / is_output_decode) and its users."""

from engine.request import SamplingParams, Sequence
from engine.scheduler import ScheduledSeq, StepPlan
from engine.scheduler.cost_model import split


def item(prompt: int, outputs: int, computed: int, n: int) -> ScheduledSeq:
    s = Sequence(
        f"r{prompt}.{outputs}.{computed}.{n}",
        list(range(10, 10 + prompt + outputs)),
        prompt,
        SamplingParams(max_tokens=16),
    )
    s.num_computed_tokens = computed
    return ScheduledSeq(s, n)


def test_decode_of_an_output_token():
    it = item(prompt=8, outputs=3, computed=10, n=1)
    assert it.samples and it.is_decode and it.is_output_decode


def test_a_prompts_last_token_decodes_but_is_no_output_decode():
    it = item(prompt=8, outputs=0, computed=7, n=1)  # the rest of the prompt was a prefix-cache hit
    assert it.samples and it.is_decode and not it.is_output_decode


def test_one_token_chunk_that_does_not_reach_the_end_is_a_prefill():
    it = item(prompt=8, outputs=0, computed=3, n=1)
    assert not it.samples and not it.is_decode and not it.is_output_decode


def test_chunks_are_prefills_even_over_output_tokens():
    last = item(prompt=8, outputs=0, computed=0, n=8)
    recompute = item(prompt=8, outputs=4, computed=8, n=4)  # a preempted sequence's outputs, recomputed
    assert last.samples and recompute.samples
    assert not last.is_decode and not recompute.is_decode and not recompute.is_output_decode


def test_the_step_cost_split_counts_decodes_by_the_same_definition():
    plan = StepPlan(scheduled=[item(8, 3, 10, 1), item(8, 0, 7, 1), item(8, 0, 3, 1), item(8, 0, 0, 8)])
    assert split(plan) == (1 + 8, 2)
