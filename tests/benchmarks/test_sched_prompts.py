"""The scheduling benchmark's prompts: whole-word tokens of the real tokenizer, so that a streamed
first token's text is whole (benchmarks/sched_prompts.py)."""

from __future__ import annotations

import random

from benchmarks.sched_http_driver import histogram_over
from benchmarks.sched_prompts import ID_RANGE, WORD, prompt, word_ids
from engine.assets import load_tokenizer


def test_word_ids_are_whole_words_of_the_vocabulary_and_prompts_draw_only_them():
    tokenizer = load_tokenizer("smollm2")
    ids = word_ids(tokenizer)
    assert len(ids) > 10_000 and all(ID_RANGE[0] <= i < ID_RANGE[1] for i in ids)
    assert all(WORD.fullmatch(tokenizer.decode([i])) for i in ids[:: max(1, len(ids) // 500)])
    byte_piece = tokenizer.encode("é", add_special_tokens=False)  # a character split into byte tokens
    assert not set(byte_piece) & set(ids)
    drawn = prompt(random.Random(3), ids, 77)
    assert len(drawn) == 77 and set(drawn) <= set(ids)
    assert drawn == prompt(random.Random(3), ids, 77)  # a seed gives the same prompt


def test_histogram_over_counts_the_runs_observations_above_each_bound():
    name = "fairlane_event_loop_lag_seconds"
    before = {f'{name}_bucket{{le="0.01"}}': 5.0, f'{name}_bucket{{le="0.05"}}': 6.0, f"{name}_count": 6.0}
    after = {f'{name}_bucket{{le="0.01"}}': 8.0, f'{name}_bucket{{le="0.05"}}': 10.0, f"{name}_count": 11.0}
    # 5 observations in the run: 3 at most 10 ms, 4 at most 50 ms
    over = histogram_over(before, after, name, (0.01, 0.05))
    assert over == {"count": 5.0, "over_10ms": 2.0, "over_50ms": 1.0}
