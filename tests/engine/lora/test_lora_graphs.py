"""Decode steps with LoRA rows through the decode-graph path (engine/cuda_graphs.py with
engine/lora/graph.py's static segment tables): on the CPU the padded static-buffer forward runs
eagerly (capture=False) through the Triton kernels in the interpreter, against the eager engine and
PEFT; tests/engine/lora/triton_sgmv_check.py replays captured graphs on a GPU."""

import pytest
import torch
from lora_adapters import AdapterRecipe, PeftReference, make_adapter, static_decode_graphs
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams

pytest.importorskip("triton")

RECIPES = [
    AdapterRecipe("qv", 4, 8, ("q_proj", "v_proj", "down_proj"), 1, 0.3),
    AdapterRecipe("mlp", 2, 4, ("o_proj", "gate_proj", "up_proj"), 2, 0.3),
    AdapterRecipe("kd", 3, 3, ("k_proj", "down_proj"), 3, 0.3),
]
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 24)), [3] * 7]
MAX_TOKENS = [7, 3, 5]  # batches of 3, 2 and 1 decodes, padded to 4, 2 and 1
KW = dict(
    dtype="float32",
    attention_backend="triton",
    lora_kernel="triton",
    block_size=4,
    kv_cache_gib=0.01,
    max_loras=2,
    max_lora_rank=4,
    cuda_graphs=False,
)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("graph-adapters")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return [make_adapter(base, r, root) for r in RECIPES]


def _generate(llm, loras):
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=0) for n in MAX_TOKENS]
    out = llm.generate(PROMPTS, params, lora=[None if a is None else str(a) for a in loras])
    return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for c in out]


def test_lora_decodes_through_the_graph_path_equal_eager_and_peft(tiny_model_dir, adapters):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # two steps' worth of adapters: the second run loads adapter 2 into a slot the graphs already read
    runs = [[adapters[0], None, adapters[1]], [adapters[2], adapters[0], None]]
    eager = LLM(model=str(tiny_model_dir), device=device, **KW)
    want = [_generate(eager, loras) for loras in runs]
    llm = LLM(model=str(tiny_model_dir), device=device, **KW)
    runner = llm.engine.runner
    lora = runner.lora
    runner.graphs = static_decode_graphs(runner)
    slot_tensors = {p: t.data_ptr() for p, t in lora.slots.a.items()}
    peft = PeftReference(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval(), adapters
    )
    for loras, ref in zip(runs, want):
        before = runner.graphs.replays
        got = _generate(llm, loras)
        # every step of a run has LoRA rows: its decode steps all replay a graph
        assert runner.graphs.replays - before >= max(MAX_TOKENS) - 1
        for (tokens, lps), (ref_tokens, ref_lps), prompt, a, n in zip(got, ref, PROMPTS, loras, MAX_TOKENS):
            assert tokens == ref_tokens == peft.greedy(a, prompt, n)
            assert max(abs(x - y) for x, y in zip(lps, ref_lps)) < 1e-5
    assert lora.slots.evictions >= 1  # adapter 2 went into a slot after the graphs were built
    assert {p: t.data_ptr() for p, t in lora.slots.a.items()} == slot_tensors


def test_graphs_leave_lora_steps_eager_without_static_tables(tiny_model_dir, adapters):
    """Graphs built without LoRA inputs (a kernel that cannot launch from device tables, torch)
    serve no step with LoRA rows; a step without any still replays."""
    llm = LLM(model=str(tiny_model_dir), **KW)
    runner = llm.engine.runner
    runner.graphs = static_decode_graphs(runner, lora=False)
    _generate(llm, [adapters[0], adapters[1], adapters[0]])
    assert runner.graphs.replays == 0
    _generate(llm, [None, None, None])
    assert runner.graphs.replays >= max(MAX_TOKENS) - 1
