"""The Triton kernels compiled on a CUDA GPU, in bf16, at real head dims and long contexts
(skipped without a GPU; the same kernels run in the interpreter in the other tests here)."""

import pytest
import torch
from kernel_reference import attention_ref, random_paged_kv, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16_TOL = 1e-2


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kvh", [(8, 8), (32, 8), (32, 4)])  # GQA ratios 1, 4, 8
def test_decode_bf16_contexts_1_to_32k(block_size, head_dim, heads, kvh):
    from engine.kernels.paged_decode import paged_decode

    lens = [1, 7, 100, 513, 4096, 32768]
    gen = torch.Generator().manual_seed(block_size * head_dim + heads)
    cache, tables, seqs = random_paged_kv(lens, kvh, head_dim, block_size, torch.bfloat16, gen)
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"), device="cuda")
    paged_decode(
        q.cuda(), cache.cuda(), tables.cuda(), torch.tensor(lens).cuda(), block_size, head_dim**-0.5, out=out
    )
    out = out.cpu()
    for i, n in enumerate(lens):
        ref = attention_ref(q[i : i + 1].cuda(), seqs[i][0].cuda(), seqs[i][1].cuda(), n - 1).cpu()
        assert rel_err(out[i : i + 1], ref) < BF16_TOL, (i, n)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kvh", [(8, 8), (32, 8), (32, 4)])
def test_prefill_bf16_fresh_and_over_long_prefixes(block_size, head_dim, heads, kvh):
    from engine.kernels.paged_prefill import paged_prefill

    chunks = [(0, 1), (0, 2048), (3000, 500), (32000, 64)]  # (cached prefix, new tokens)
    gen = torch.Generator().manual_seed(block_size + head_dim + heads)
    lens = [p + n for p, n in chunks]
    cache, tables, seqs = random_paged_kv(lens, kvh, head_dim, block_size, torch.bfloat16, gen)
    starts = [0]
    for _, n in chunks:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1], heads, head_dim, generator=gen).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"), device="cuda")
    paged_prefill(
        q.cuda(),
        cache.cuda(),
        tables.cuda(),
        torch.tensor(starts).cuda(),
        torch.tensor(lens).cuda(),
        max(n for _, n in chunks),
        block_size,
        head_dim**-0.5,
        out=out,
    )
    out = out.cpu()
    for i, (p, n) in enumerate(chunks):
        rows = slice(starts[i], starts[i] + n)
        ref = attention_ref(q[rows].cuda(), seqs[i][0].cuda(), seqs[i][1].cuda(), p).cpu()
        assert rel_err(out[rows], ref) < BF16_TOL, (i, p, n)


def test_decode_fp32_is_full_precision():
    from engine.kernels.paged_decode import paged_decode

    gen = torch.Generator().manual_seed(0)
    lens = [300, 5000]
    cache, tables, seqs = random_paged_kv(lens, 8, 128, 16, torch.float32, gen)
    q = torch.randn(2, 32, 128, generator=gen)
    out = paged_decode(q.cuda(), cache.cuda(), tables.cuda(), torch.tensor(lens).cuda(), 16, 128**-0.5).cpu()
    for i, n in enumerate(lens):
        assert rel_err(out[i : i + 1], attention_ref(q[i : i + 1], seqs[i][0], seqs[i][1], n - 1)) < 1e-5
