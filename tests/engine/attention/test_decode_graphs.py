"""The decode-graph path's static buffers and padding rows (slot -1, context 0) give the tokens
plain decode steps give. On CPU the padded static-buffer forward runs eagerly (capture=False)
through the triton kernels in the interpreter; test_engine_cuda.py replays real graphs."""

import torch

from engine import LLM, SamplingParams
from engine.cuda_graphs import DecodeGraphs, capture_sizes

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 30)), [3] * 11]
MAX_TOKENS = [9, 4, 7]  # batches of 3, 2 and 1 decodes, padded to 4, 2 and 1


def test_capture_sizes_cover_every_batch_up_to_the_largest():
    assert capture_sizes(5) == [1, 2, 4, 5]
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and 96 in sizes
    assert all(b - a <= 32 for a, b in zip(sizes, sizes[1:]))


def test_padded_static_buffer_decode_equals_plain_decode(tiny_model_dir):
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kw = dict(
        dtype="float32",
        device=device,
        attention_backend="triton",
        block_size=4,
        kv_cache_gib=0.01,
        cuda_graphs=False,
    )
    plain = [c.token_ids for c in LLM(model=str(tiny_model_dir), **kw).generate(PROMPTS, params)]
    llm = LLM(model=str(tiny_model_dir), **kw)
    runner = llm.engine.runner
    runner.graphs = DecodeGraphs(
        runner.model,
        runner.kv_caches,
        runner.block_size,
        max_batch=4,
        max_blocks=32,
        device=runner.device,
        capture=False,
    )
    padded = [c.token_ids for c in llm.generate(PROMPTS, params)]
    assert padded == plain
    assert runner.graphs.replays >= max(MAX_TOKENS) - 1
