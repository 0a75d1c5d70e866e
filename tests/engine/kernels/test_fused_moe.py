"""The Triton fused-MoE kernel (interpreter on CPU) against float64 per-token experts written from
transformers' MixtralExperts / GptOssExperts, and against the torch reference: experts with no
token, T = 1, top-k 1 to 4, biases, gpt-oss's clamped SwiGLU with interleaved gate/up, both tile
shapes, fp32 and bf16 (upcast after loading), weights read in place through transposed views."""

from __future__ import annotations

import pytest
import torch
from kernel_reference import DEVICE

from engine.kernels.fused_moe import MoEConfig, choose_config, fused_moe, fused_moe_reference
from engine.kernels.moe_reference import align_tokens

SMALL, LARGE = MoEConfig(16, 64, 128, 1), MoEConfig(64, 64, 64, 8)


def routing(T: int, E: int, k: int, gen: torch.Generator, skip: tuple[int, ...] = ()):
    """Each token's k distinct experts (none of `skip`) and softmax weights [T, k] fp32."""
    allowed = torch.tensor([e for e in range(E) if e not in skip])
    scores = torch.rand(T, len(allowed), generator=gen)
    ids = allowed[scores.topk(k, dim=1).indices]
    weights = torch.softmax(torch.randn(T, k, generator=gen), dim=1)
    return ids, weights


def experts(E: int, H: int, inter: int, gen: torch.Generator, bias: bool):
    w1 = torch.randn(E, 2 * inter, H, generator=gen) * H**-0.5
    w2 = torch.randn(E, H, inter, generator=gen) * inter**-0.5
    b1 = torch.randn(E, 2 * inter, generator=gen) if bias else None
    b2 = torch.randn(E, H, generator=gen) if bias else None
    return w1, w2, b1, b2


def per_token(x, w1, w2, ids, weights, b1=None, b2=None, act="silu", limit=0.0, alpha=1.702, inter_=False):
    """float64, one token and one expert at a time, the formulas of transformers' experts."""
    x, w1, w2 = x.double(), w1.double(), w2.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            gu = w1[e] @ x[t] + (0 if b1 is None else b1[e].double())
            gate, up = (gu[0::2], gu[1::2]) if inter_ else gu.chunk(2)
            if act == "silu":
                h = torch.nn.functional.silu(gate) * up
            else:  # GptOssExperts._apply_gate
                gate = gate.clamp(max=limit) if limit else gate
                up = up.clamp(-limit, limit) if limit else up
                h = (up + 1) * (gate * torch.sigmoid(gate * alpha))
            y = w2[e] @ h + (0 if b2 is None else b2[e].double())
            out[t] += weights[t, j].double() * y
    return out


def run(x, w1, w2, ids, weights, dtype, **kw):
    on = {k: (v.to(DEVICE, dtype) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return fused_moe(
        x.to(DEVICE, dtype),
        w1.to(DEVICE, dtype),
        w2.to(DEVICE, dtype),
        ids.to(DEVICE),
        weights.to(DEVICE),
        **on,
    ).cpu()


@pytest.mark.parametrize("config", [SMALL, LARGE])
@pytest.mark.parametrize("T,k", [(1, 1), (1, 4), (5, 2), (23, 3)])
def test_silu_experts_in_fp32(config, T, k):
    gen = torch.Generator().manual_seed(T * 10 + k)
    E, H, inter = 8, 64, 48  # I not a multiple of the 64-column tile
    x = torch.randn(T, H, generator=gen)
    w1, w2, _, _ = experts(E, H, inter, gen, bias=False)
    ids, weights = routing(T, E, k, gen, skip=(2, 5))  # two experts get no token
    got = run(x, w1, w2, ids, weights, torch.float32, config=config)
    want = per_token(x, w1, w2, ids, weights)
    assert (got.double() - want).abs().max() < 2e-5
    assert (got - fused_moe_reference(x, w1, w2, ids, weights)).abs().max() < 2e-5


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("config", [SMALL, LARGE])
def test_gpt_oss_swiglu_with_biases_in_fp32(interleaved, config):
    gen = torch.Generator().manual_seed(int(interleaved) + 2 * config.block_m)
    T, E, k, H, inter = 9, 4, 4, 64, 32
    x = torch.randn(T, H, generator=gen) * 3
    w1, w2, b1, b2 = experts(E, H, inter, gen, bias=True)
    ids, weights = routing(T, E, k, gen)
    kw = dict(activation="swigluoai", swiglu_limit=1.5, swiglu_alpha=1.702, interleaved_gate_up=interleaved)
    got = run(x, w1, w2, ids, weights, torch.float32, b_gate_up=b1, b_down=b2, config=config, **kw)
    want = per_token(x, w1, w2, ids, weights, b1, b2, "swigluoai", 1.5, 1.702, interleaved)
    assert (got.double() - want).abs().max() < 2e-5
    # the clamp bites: without it the answer differs
    loose = per_token(x, w1, w2, ids, weights, b1, b2, "swigluoai", 0.0, 1.702, interleaved)
    assert (loose - want).abs().max() > 1e-2


@pytest.mark.parametrize("act", ["silu", "swigluoai"])
def test_bf16_within_tolerance_of_float64(act):
    gen = torch.Generator().manual_seed(4)
    T, E, k, H, inter = 6, 6, 2, 64, 64
    x = torch.randn(T, H, generator=gen).bfloat16().float()
    w1, w2, b1, b2 = (t.bfloat16().float() for t in experts(E, H, inter, gen, bias=True))
    ids, weights = routing(T, E, k, gen)
    kw = dict(activation=act, swiglu_limit=7.0 if act == "swigluoai" else 0.0)
    got = run(x, w1, w2, ids, weights, torch.bfloat16, b_gate_up=b1, b_down=b2, **kw)
    assert got.dtype == torch.bfloat16
    want = per_token(x, w1, w2, ids, weights, b1, b2, act, kw["swiglu_limit"])
    # the intermediate h and the output are rounded to bf16 once each
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-2


def test_weights_read_in_place_through_transposed_views():
    # gpt-oss stores gate_up [E, H, 2I] and down [E, I, H]: .transpose(1, 2) views, no copy
    gen = torch.Generator().manual_seed(6)
    T, E, k, H, inter = 4, 4, 2, 64, 32
    x = torch.randn(T, H, generator=gen)
    w1, w2, b1, b2 = experts(E, H, inter, gen, bias=True)
    w1_t, w2_t = (
        w1.transpose(1, 2).contiguous().transpose(1, 2),
        w2.transpose(1, 2).contiguous().transpose(1, 2),
    )
    assert not w1_t.is_contiguous() and torch.equal(w1_t, w1)
    ids, weights = routing(T, E, k, gen)
    x, w1, w2, w1_t, w2_t, ids, weights = (t.to(DEVICE) for t in (x, w1, w2, w1_t, w2_t, ids, weights))
    kw = dict(
        b_gate_up=b1.to(DEVICE),
        b_down=b2.to(DEVICE),
        activation="swigluoai",
        swiglu_limit=7.0,
        interleaved_gate_up=True,
    )
    got = fused_moe(x, w1_t, w2_t, ids, weights, **kw)
    assert (got - fused_moe(x, w1, w2, ids, weights, **kw)).abs().max() < 1e-6


def test_alignment_puts_each_block_on_one_expert():
    gen = torch.Generator().manual_seed(7)
    T, E, k, bm = 13, 8, 3, 16
    ids, _ = routing(T, E, k, gen, skip=(0, 4))
    a = align_tokens(ids, E, bm)
    n, used = T * k, int(a.num_padded)
    assert sorted(a.sorted_ids[a.sorted_ids < n].tolist()) == list(range(n))  # every row once
    assert (a.sorted_ids[used:] == n).all()  # past the padded length: padding only
    flat = ids.reshape(-1)
    for b in range(used // bm):
        rows = a.sorted_ids[b * bm : (b + 1) * bm]
        rows = rows[rows < n].long()
        assert len(rows) and (flat[rows] == a.block_expert[b]).all()
    assert a.counts.tolist() == torch.bincount(flat, minlength=E).tolist()
    assert used == sum(-(-c // bm) * bm for c in a.counts.tolist())


def test_config_by_rows_per_expert():
    assert choose_config(8, 128).block_m == 16  # a decode step: one block per touched expert
    assert choose_config(4096 * 8, 128).block_m == 64


def test_bad_arguments_are_named():
    x, w1, w2 = torch.zeros(2, 64), torch.zeros(4, 64, 64), torch.zeros(4, 64, 32)
    ids, weights = torch.zeros(2, 2, dtype=torch.int64), torch.zeros(2, 2)
    with pytest.raises(ValueError, match="unknown MoE activation"):
        fused_moe(x, w1, w2, ids, weights, activation="gelu")
    with pytest.raises(ValueError, match="w_down"):
        fused_moe(x, w1, torch.zeros(4, 64, 16), ids, weights)
    with pytest.raises(ValueError, match="topk_weights must be float32"):
        fused_moe(x, w1, w2, ids, weights.half())
    with pytest.raises(ValueError, match="b_down"):
        fused_moe(x, w1, w2, ids, weights, b_down=torch.zeros(4, 32))
