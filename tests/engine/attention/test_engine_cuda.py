"""The engine on a CUDA GPU (skipped without one): greedy tokens equal Hugging Face's on the same
random weights in fp32, with preemption, on both attention backends; CUDA-graph decode steps
give the tokens eager steps give."""

import pytest
import torch
from hf_reference import hf_greedy
from transformers import LlamaConfig, LlamaForCausalLM

from engine import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PROMPTS = [list(range(3, 40)), [7] * 130, list(range(100, 105)), list(range(200, 460)), [9, 8, 7]]
MAX_TOKENS = [40, 25, 60, 33, 50]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module", params=[64, 128], ids=["head_dim64", "head_dim128"])
def model_dir(request, tmp_path_factory):
    d = request.param
    torch.manual_seed(d)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=4 * d,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=d,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=1,
        bos_token_id=0,
        pad_token_id=0,
    )
    path = tmp_path_factory.mktemp(f"llama-d{d}")
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reference(model_dir):
    return hf_greedy(
        LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), PROMPTS, MAX_TOKENS
    )


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("blocks, mode", [(None, "recompute"), (24, "recompute"), (24, "swap")])
def test_greedy_matches_hf_on_the_gpu(model_dir, reference, backend, blocks, mode):
    llm = LLM(
        model=str(model_dir),
        device="cuda",
        dtype="float32",
        attention_backend=backend,
        block_size=16,
        num_kv_blocks=blocks,
        max_num_batched_tokens=128,
        preemption_mode=mode,
        num_swap_blocks=64,
    )
    out = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS])
    assert [c.token_ids for c in out] == reference
    if blocks:  # 384 slots for 643 tokens, sequences of up to 293: must preempt
        assert llm.engine.stats.preemptions > 0
        assert (llm.engine.stats.swaps > 0) == (mode == "swap")
    if backend == "triton":
        assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.replays > 0
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks


def test_graph_replayed_decode_equals_eager_decode(model_dir):
    """Batch sizes 1..5 shrink as requests finish, so several captured sizes (with padding) run."""
    runs = {}
    for graphs in (True, False):
        llm = LLM(
            model=str(model_dir),
            device="cuda",
            dtype="float32",
            attention_backend="triton",
            cuda_graphs=graphs,
            cuda_graph_max_batch=8,
        )
        runs[graphs] = [c.token_ids for c in llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS])]
        runner = llm.engine.runner
        assert (runner.graphs is not None and runner.graphs.replays > 0) == graphs
    assert runs[True] == runs[False]
