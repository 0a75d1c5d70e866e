"""The torch MoE reference against transformers' own expert modules (MixtralExperts: silu, gate and
up concatenated, no biases; GptOssExperts: clamped SwiGLU, interleaved, biases, its checkpoint's
[E, H, 2I] / [E, I, H] layouts read through transposed views), fp32."""

from __future__ import annotations

import pytest
import torch
from transformers import GptOssConfig, MixtralConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers.models.mixtral.modeling_mixtral import MixtralExperts

from engine.kernels.moe_reference import fused_moe_reference

T, H, INTER, E = 11, 64, 48, 6


def _routing(k: int, gen: torch.Generator):
    scores = torch.rand(T, E - 1, generator=gen)  # expert E - 1 gets no token
    return scores.topk(k, dim=1).indices, torch.softmax(torch.randn(T, k, generator=gen), dim=1)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_silu_experts_equal_mixtral(k):
    gen = torch.Generator().manual_seed(k)
    cfg = MixtralConfig(hidden_size=H, intermediate_size=INTER, num_local_experts=E, num_experts_per_tok=k)
    mod = MixtralExperts(cfg)
    with torch.no_grad():
        mod.gate_up_proj.copy_(torch.randn(E, 2 * INTER, H, generator=gen) * H**-0.5)
        mod.down_proj.copy_(torch.randn(E, H, INTER, generator=gen) * INTER**-0.5)
    x = torch.randn(T, H, generator=gen)
    ids, weights = _routing(k, gen)
    with torch.no_grad():
        want = mod(x, ids, weights)
    got = fused_moe_reference(x, mod.gate_up_proj.detach(), mod.down_proj.detach(), ids, weights)
    assert (got - want).abs().max() < 1e-5


@pytest.mark.parametrize("limit", [7.0, 0.8])
def test_swigluoai_experts_equal_gpt_oss(limit):
    gen = torch.Generator().manual_seed(int(limit * 10))
    cfg = GptOssConfig(
        hidden_size=H, intermediate_size=INTER, num_local_experts=E, num_experts_per_tok=4, swiglu_limit=limit
    )
    mod = GptOssExperts(cfg)
    with torch.no_grad():
        mod.gate_up_proj.copy_(torch.randn(E, H, 2 * INTER, generator=gen) * H**-0.5)
        mod.gate_up_proj_bias.copy_(torch.randn(E, 2 * INTER, generator=gen))
        mod.down_proj.copy_(torch.randn(E, INTER, H, generator=gen) * INTER**-0.5)
        mod.down_proj_bias.copy_(torch.randn(E, H, generator=gen))
    x = torch.randn(T, H, generator=gen) * 2
    ids, weights = _routing(4, gen)
    with torch.no_grad():
        want = mod(x, ids, weights)
    got = fused_moe_reference(
        x,
        mod.gate_up_proj.detach().transpose(1, 2),  # [E, 2I, H]
        mod.down_proj.detach().transpose(1, 2),  # [E, H, I]
        ids,
        weights,
        b_gate_up=mod.gate_up_proj_bias.detach(),
        b_down=mod.down_proj_bias.detach(),
        activation="swigluoai",
        swiglu_limit=mod.limit,  # what the module applies: transformers 5.17 fixes it at 7.0
        swiglu_alpha=mod.alpha,
        interleaved_gate_up=True,
    )
    assert (got - want).abs().max() < 1e-5


def test_expert_ids_out_of_range_are_refused():
    x, w1, w2 = torch.zeros(2, 8), torch.zeros(3, 8, 8), torch.zeros(3, 8, 4)
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 3\)"):
        fused_moe_reference(x, w1, w2, torch.tensor([[0], [3]]), torch.ones(2, 1))
