"""INT8 (EngineConfig.quantization="int8"): the C kernel computes exactly the reference arithmetic
(int8 weights, activations quantized per block of 32), and on the real model the quality loss stays
within stated tolerances: perplexity on a fixed text within 3% of fp32's with the weights quantized
alone (the dequantizing path) and within 5% with the activations quantized too (the C kernel, every
CPU call), and greedy outputs that mostly agree."""

import math

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models import quant

TEXT = (
    "The gateway authenticates each tenant, enforces its quotas and puts every request into a "
    "priority lane. Engine workers pull from the lanes into a continuous-batching engine whose "
    "scheduler keeps tenants fair and admits work only while its latency target can still be met. "
    "Operators manage tenants, keys and quotas over an admin API, and SREs follow each request in "
    "traces and metrics."
)
CHATS = [
    [{"role": "user", "content": c}]
    for c in (
        "Name three colors.",
        "What is the capital of France?",
        "Write one sentence about the sea.",
        "What is 12 plus 30?",
        "Give me a word that rhymes with cat.",
        "What do bees make?",
    )
]


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 17, 32])
@pytest.mark.parametrize("N,K", [(12, 64), (20, 96), (64, 576)])
def test_kernel_equals_the_reference_arithmetic(M, N, K):
    torch.manual_seed(M * 1000 + N + K)
    w, x, bias = torch.randn(N, K), torch.randn(M, K), torch.randn(N)
    layer = quant.Int8Linear(w, bias)
    assert layer.lib is not None  # a C compiler is on every machine this suite runs on
    expected = quant.reference(x, layer.rows, layer.scale, bias)
    assert torch.allclose(layer(x), expected, rtol=1e-5, atol=1e-4)
    assert torch.allclose(quant.Int8Linear(w)(x), expected - bias, rtol=1e-5, atol=1e-4)
    # the activation quantization costs little next to the weights' own: within 2% of the norm
    dense = x @ layer.weight.T + bias
    assert (layer(x) - dense).norm() <= 0.02 * dense.norm()


def test_activation_blocks_quantize_within_half_a_step():
    torch.manual_seed(1)
    x = torch.randn(3, 96) * torch.tensor([1e-3, 1.0, 50.0])[:, None]
    x[1, 32:64] = 0  # an all-zero block: scale 0, values 0
    q, d = quant.quantize_activations(x)
    assert d.shape == (3, 3) and d[1, 1] == 0 and (q[1, 32:64] == 0).all()
    err = (q.float().reshape(3, 3, 32) * d[..., None] - x.reshape(3, 3, 32)).abs()
    assert (err <= d[..., None] / 2 + 1e-7).all()


@pytest.mark.parametrize("N,K", [(5, 40), (6, 64), (8, 40)])
def test_shapes_off_the_kernel_layout_take_the_dense_path(N, K):
    torch.manual_seed(2)
    w, x = torch.randn(N, K), torch.randn(3, K)
    layer = quant.Int8Linear(w)
    assert layer.lib is None
    assert torch.allclose(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)


def test_quantization_error_is_within_half_a_step_per_channel():
    torch.manual_seed(0)
    w = torch.randn(48, 96) * torch.linspace(0.01, 3, 48)[:, None]  # channels of very different ranges
    q, scale = quant.quantize(w)
    assert q.dtype == torch.int8 and scale.shape == (48,)
    assert torch.equal(quant.unpack(quant.pack(q)), q)
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()
    assert quant.Int8Linear(w).nbytes == 48 * 96 + 4 * 48  # a quarter of fp32's bytes, plus scales


def _perplexity(llm: LLM, text: str) -> float:
    ids = llm.tokenizer(text)["input_ids"]
    engine = llm.engine
    engine.add_request("ppl", ids, SamplingParams(max_tokens=1, temperature=0))
    plan = engine.scheduler.schedule()
    items, hidden, _ = engine.runner.forward(plan)
    logits = engine.runner.model.logits(hidden[: len(ids)])
    engine.abort("ppl")
    nll = -torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None]).mean()
    return math.exp(nll.item())


@pytest.fixture(scope="module")
def int8():
    return LLM(model="smollm2", dtype="float32", num_threads=2, quantization="int8")


def test_int8_perplexity_stays_close_to_fp32(smollm2, int8):
    """Measured on SmolLM2 (this text): fp32 453.7; weights alone 459.7 (+1.3%); with the kernel's
    per-32-block activations 471.9 (+4.0%), most of the added loss at the q/k/v input (the RMSNorm
    output, whose few large channels set their blocks' scales). The kernel's output is the same to
    the bit built for AVX2 (-march=haswell) and for AVX-512: the loss is the arithmetic's, not a CPU's."""
    fp32, q = _perplexity(smollm2, TEXT), _perplexity(int8, TEXT)
    layers = [lin for layer in int8.engine.runner.model.layers for lin in vars(layer).values()]
    layers = [lin for lin in layers + [int8.engine.runner.model.lm_head] if isinstance(lin, quant.Int8Linear)]
    libs = [lin.lib for lin in layers]
    try:
        for lin in layers:
            lin.lib = None  # the dequantizing path: int8 weights, fp32 activations
        weights_only = _perplexity(int8, TEXT)
    finally:
        for lin, lib in zip(layers, libs):
            lin.lib = lib
    assert weights_only / fp32 < 1.03, (fp32, weights_only)
    assert q / fp32 < 1.05, (fp32, q)


def test_int8_greedy_outputs_mostly_agree_with_fp32(smollm2, int8):
    """Teacher-forced on fp32's greedy continuation: INT8 ranks fp32's token first at most positions.
    How long two greedy runs agree is chance (one near tie forks them; 40-60% of tokens on different
    CPUs), so the free-running agreement is only required to be exact for some prompt."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    ref = [c.token_ids for c in smollm2.generate(CHATS, params)]
    prompts = [smollm2.encode(chat) for chat in CHATS]
    scored = int8.generate(
        [p + r for p, r in zip(prompts, ref)], SamplingParams(max_tokens=0, prompt_logprobs=1)
    )
    hits = [
        sum(c.prompt_logprobs[len(p) + i].top[0][0] == t for i, t in enumerate(r))
        for p, r, c in zip(prompts, ref, scored)
    ]
    assert sum(hits) / sum(map(len, ref)) >= 0.85, hits
    ours = [c.token_ids for c in int8.generate(CHATS, params)]
    assert any(o == r for o, r in zip(ours, ref))  # some outputs are identical throughout


def test_dense_path_never_materialises_a_float32_weight():
    # the dense path (a GPU, or shapes off the kernel's layout): int8 rows in the activations'
    # dtype, scale on the output; a bf16 call makes no fp32 [N, K] tensor
    from torch.utils._python_dispatch import TorchDispatchMode

    N, K = 8, 40
    layer = quant.Int8Linear(torch.randn(N, K))
    x = torch.randn(3, K).to(torch.bfloat16)
    made = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                made.append((out.dtype, tuple(out.shape)))
            return out

    with Record():
        y = layer(x)
    assert (torch.float32, (N, K)) not in made, made
    ref = x.float() @ (layer.rows.float() * layer.scale[:, None]).T
    assert y.dtype == torch.bfloat16 and torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2)
