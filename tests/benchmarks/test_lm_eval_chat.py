"""fairlane_chat_qa as lm-eval reads it: the task file and its items parse, each item's chat prompt
carries the template's control tokens as single ids, the stop strings are lm-eval's, and the
scores are those the task file names."""

from benchmarks import lm_eval_chat as chat
from benchmarks.lm_eval_tasks.chat_qa_utils import scores
from engine import assets


def test_the_task_file_and_its_items_parse():
    task, docs = chat.read_task()
    assert task["generation_kwargs"]["max_gen_toks"] == 32 and not task["generation_kwargs"]["do_sample"]
    assert len(docs) == 50 and len({d["question"] for d in docs}) == 50
    assert chat.user_text(task, docs[0]) == "What is 2 + 3? Reply with the answer only."


def test_a_chat_prompt_holds_the_templates_control_tokens_as_single_ids():
    tokenizer = assets.load_tokenizer("smollm2")
    task, docs = chat.read_task()
    prompt = chat.chat_prompt(tokenizer, chat.user_text(task, docs[0]))
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(start) == 3 and ids == assets.encode_prompt(tokenizer, prompt)


def test_stop_strings_are_the_tasks_until_and_the_eos_text():
    tokenizer = assets.load_tokenizer("smollm2")
    task, _ = chat.read_task()
    stops = chat.stop_strings(task, tokenizer)
    assert stops == ["\n\n", "<|im_end|>"]
    assert chat.cut("The answer is 5.\n\nWhy: ...", stops) == "The answer is 5."


def test_scores_exact_match_and_contains():
    assert scores(" Paris.", "Paris") == {"exact_match": 1, "contains": 1}
    assert scores("The capital of France is Paris.", "Paris") == {"exact_match": 0, "contains": 1}
    assert scores("2 + 3 = 15", "5") == {"exact_match": 0, "contains": 0}
    assert scores("It is 100.", "10") == {"exact_match": 0, "contains": 0}
