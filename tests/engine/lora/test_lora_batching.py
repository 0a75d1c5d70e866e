"""Batched LoRA on the tiny test model: a mixed batch against PEFT, slots under pressure, the
prefix cache kept apart per adapter, the host cache bounded."""

import pytest
import torch
from lora_adapters import AdapterRecipe, PeftReference, engine_prefill_logits, make_adapter
from transformers import AutoModelForCausalLM

from engine import LLM, Engine, LoRARequest, SamplingParams

RECIPES = [
    AdapterRecipe("qv", 4, 8, ("q_proj", "v_proj"), 1, 0.2),
    AdapterRecipe(
        "all", 8, 16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), 2, 0.2
    ),
    AdapterRecipe("mlp-rs", 2, 4, ("gate_proj", "down_proj"), 3, 0.3, rslora=True),
    AdapterRecipe("ko", 6, 6, ("k_proj", "o_proj", "up_proj"), 4, 0.3),
    AdapterRecipe("v", 1, 2, ("v_proj",), 5, 0.5),
    AdapterRecipe("qd", 3, 3, ("q_proj", "down_proj"), 6, 0.3),
]
PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11],
    [12, 13, 14],
    [20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
    [3, 4],
    [40, 41, 42, 43],
]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return [make_adapter(base, r, root) for r in RECIPES]


@pytest.fixture(scope="module")
def peft(tiny_model_dir, adapters):
    return PeftReference(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval(), adapters
    )


def test_mixed_batch_logits_match_peft(tiny_model_dir, peft, adapters):
    eng = Engine(model=str(tiny_model_dir), dtype="float32", max_loras=4, max_lora_rank=8)
    loras = [None, adapters[0], adapters[1], adapters[2], adapters[3]]
    reqs = [
        (f"r{i}", p, None if a is None else LoRARequest(f"a{i}", str(a)))
        for i, (p, a) in enumerate(zip(PROMPTS, loras))
    ]
    ours = engine_prefill_logits(eng, reqs)
    for i, (p, a) in enumerate(zip(PROMPTS, loras)):
        ref = peft.logits(a, p)
        assert (ours[f"r{i}"] - ref).abs().max().item() < 1e-4
        if a is not None:  # the adapter changes the logits: the test would catch a dropped delta
            assert (ref - peft.logits(None, p)).abs().max().item() > 1e-2


def test_more_adapters_than_slots_every_request_right(tiny_model_dir, peft, adapters):
    llm = LLM(model=str(tiny_model_dir), dtype="float32", max_loras=2, max_lora_rank=8)
    eng = llm.engine
    loras = [adapters[i % 6] for i in range(12)]  # 6 adapters in use, 2 slots
    prompts = [PROMPTS[i % 5] for i in range(12)]
    want = [peft.greedy(a, p, 6) for p, a in zip(prompts, loras)]
    distinct_running = []
    real_step = eng.step

    def step():
        out = real_step()
        distinct_running.append(len({s.lora for s in eng.scheduler.running if s.lora}))
        return out

    eng.step = step
    out = llm.generate(
        prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), lora=[str(a) for a in loras]
    )
    assert [c.token_ids for c in out] == want
    assert max(distinct_running) <= 2
    assert eng.stats.lora_slot_loads >= 6 and eng.stats.lora_slot_evictions >= 4
    assert eng.stats.lora_slot_loads == eng.lora.slots.loads
    assert not eng.lora.pins and eng.num_free_blocks == eng.num_total_blocks


def test_prefix_cache_is_never_shared_across_adapters(tiny_model_dir, peft, adapters):
    eng = Engine(model=str(tiny_model_dir), dtype="float32", max_loras=2, max_lora_rank=8, block_size=4)
    prompt = list(range(30, 43))  # 13 tokens: 3 full blocks
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)

    def run(rid, lora):
        before = eng.block_manager.num_prefix_hit_tokens
        eng.add_request(rid, prompt, params, lora=lora)
        tokens = []
        while eng.has_unfinished():
            tokens += [t for o in eng.step() for t in o.new_token_ids]
        return tokens, eng.block_manager.num_prefix_hit_tokens - before

    a, b = str(adapters[1]), str(adapters[3])
    assert run("a1", a) == (peft.greedy(adapters[1], prompt, 4), 0)
    assert run("b1", b) == (peft.greedy(adapters[3], prompt, 4), 0)  # a's blocks are not b's
    assert run("base", None) == (peft.greedy(None, prompt, 4), 0)
    assert run("a2", a) == (peft.greedy(adapters[1], prompt, 4), 12)  # a's own blocks are reused


def test_host_cache_keeps_pinned_and_drops_least_recent(tiny_model_dir, adapters):
    eng = Engine(model=str(tiny_model_dir), dtype="float32", max_loras=1, max_lora_rank=8, max_cpu_loras=2)
    params = SamplingParams(max_tokens=2, temperature=0)
    for i in range(4):  # 4 queued requests, 4 adapters: all pinned beyond max_cpu_loras
        eng.add_request(f"q{i}", [3, 4, 5], params, lora=str(adapters[i]))
    assert len(eng.lora.host) == 4
    while eng.has_unfinished():
        eng.step()
    assert len(eng.lora.host) == 2 and not eng.lora.pins
    loads = eng.lora.host_loads
    eng.add_request("again", [3, 4, 5], params, lora=str(adapters[3]))  # most recent: still cached
    assert eng.lora.host_loads == loads
    eng.abort("again")
    eng.add_request("old", [3, 4, 5], params, lora=str(adapters[0]))  # dropped: read again
    assert eng.lora.host_loads == loads + 1
    eng.abort("old")


@pytest.mark.parametrize("named", [False, True])
def test_n_choices_on_an_adapter(tiny_model_dir, peft, adapters, named):
    # Every choice of an n > 1 request runs on the request's adapter: choices 1..n-1 pinned it again
    # by its uid taken for a folder path, an AdapterNotFoundError after choice 0 was already queued.
    eng = Engine(model=str(tiny_model_dir), dtype="float32", max_loras=2, max_lora_rank=8)
    prompt, a = PROMPTS[0], adapters[1]
    lora = LoRARequest("all", str(a)) if named else str(a)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, n=3)
    eng.add_request("r", prompt, params, lora=lora)
    tokens: dict[int, list[int]] = {}
    while eng.has_unfinished():
        for o in eng.step():
            tokens.setdefault(o.index, []).extend(o.new_token_ids)
    assert tokens == {i: peft.greedy(a, prompt, 5) for i in range(3)}
    eng.add_request("gone", prompt, params, lora=lora)  # aborted before choices 1..2 start
    eng.abort("gone")
    assert not eng.lora.pins and eng.num_free_blocks == eng.num_total_blocks
