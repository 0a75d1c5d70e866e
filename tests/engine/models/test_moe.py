"""The MoE block (engine/models/moe.py) on its own: gpt-oss's experts (router bias, softmax after
the top-k, per-expert biases, clamped SwiGLU over interleaved gate/up columns) against transformers'
GptOssMLP, on the C-kernel, torch and INT8 paths; the expert counter; which layers are experts."""

from __future__ import annotations

import pytest
import torch
from transformers import GptOssConfig, Qwen3MoeConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

from engine.models.families import gpt_oss, qwen3_moe
from engine.models.fused import TorchOps
from engine.models.moe import GPT_OSS_ACTIVATION, ExpertCounter, MoEBlock
from engine.models.ops import make_ops


def _gpt_oss_mlp(limit: float) -> tuple[GptOssConfig, GptOssMLP]:
    config = GptOssConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=3,
        swiglu_limit=limit,
    )
    torch.manual_seed(0)
    mlp = GptOssMLP(config).eval()
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0.0, 0.3)  # biases included: an ignored one shows
    return config, mlp


@pytest.mark.parametrize("path", ["c", "torch", "int8"])
@pytest.mark.parametrize("limit", [7.0, 0.5])  # 0.5: the clamps bite on most gate/up values
def test_gpt_oss_experts_equal_transformers(path, limit):
    config, mlp = _gpt_oss_mlp(limit)
    spec = gpt_oss.full_spec(config)
    sd = {f"model.layers.0.mlp.{k}": v.detach() for k, v in mlp.state_dict().items()}
    block = MoEBlock.from_state_dict(
        sd,
        "model.layers.0.",
        spec,
        torch.float32,
        ExpertCounter("cpu"),
        quantization="int8" if path == "int8" else None,
        cpu_kernels=path != "torch",
    )
    assert block.activation == GPT_OSS_ACTIVATION
    assert (block.linears is not None) == (path != "torch")
    h = torch.randn(11, 64)
    with torch.no_grad():
        want = mlp(h[None])[0][0]
    got = block(h, make_ops(torch.device("cpu"), torch.float32, path != "torch"))
    tolerance = 0.05 * want.abs().max() if path == "int8" else 1e-5
    assert (got - want).abs().max() < tolerance
    assert block.counter.value() == len(set(block.route(h)[1].reshape(-1).tolist()))


def test_counter_sums_distinct_experts_over_layers():
    counter = ExpertCounter("cpu")
    counter.add(torch.tensor([[0, 3], [3, 5]]), 8)  # 3 distinct
    counter.add(torch.tensor([[1, 1]]), 8)  # 1
    assert counter.value() == 4
    counter.reset()
    assert counter.value() == 0


def test_tokens_routed_to_no_expert_of_theirs_get_nothing_from_it():
    """A grouped step equals each token through its own top-k experts, one by one."""
    config, mlp = _gpt_oss_mlp(7.0)
    spec = gpt_oss.full_spec(config)
    sd = {f"model.layers.0.mlp.{k}": v.detach() for k, v in mlp.state_dict().items()}
    block = MoEBlock.from_state_dict(sd, "model.layers.0.", spec, torch.float32, ExpertCounter("cpu"))
    h = torch.randn(9, 64)
    batched = block(h, TorchOps())
    solo = torch.cat([block(h[i : i + 1], TorchOps()) for i in range(9)])
    assert torch.equal(batched, solo)  # the C kernel's rows do not depend on their batch


@pytest.mark.parametrize(
    "step,dense,want",
    [(1, [], [True] * 4), (2, [], [False, True, False, True]), (1, [0, 3], [False, True, True, False])],
)
def test_qwen3_moe_mixes_dense_layers_as_transformers_does(step, dense, want):
    config = Qwen3MoeConfig(num_hidden_layers=4, decoder_sparse_step=step, mlp_only_layers=dense)
    assert qwen3_moe.moe_layers(config) == tuple(want)
    spec = qwen3_moe.spec(config)
    names = spec.weight_names()
    for i, moe in enumerate(want):
        assert (f"model.layers.{i}.mlp.gate.weight" in names) == moe
        assert (f"model.layers.{i}.mlp.gate_proj.weight" in names) == (not moe)


@pytest.mark.parametrize("bias", [False, True])
def test_one_call_c_kernel_equals_torch_and_ignores_the_batch(bias):
    """csrc/moe_f32.c (a whole layer's SiLU experts in one call) against the torch path; a token's
    output is the same alone and in a batch (prefill-sized too: more rows than a register tile)."""
    from engine.models.linear import Linear
    from engine.models.spec import MoESpec

    torch.manual_seed(0)
    E, H, inter = 6, 64, 40  # 2I = 80 and H = 64: panels padded on the gate/up side
    spec = MoESpec(num_experts=E, top_k=3, intermediate_size=inter, norm_topk_prob=True, layers=(True,))
    gu, dn, router = torch.randn(E, 2 * inter, H) * 0.2, torch.randn(E, H, inter) * 0.2, torch.randn(E, H)
    b = (torch.randn(E, 2 * inter), torch.randn(E, H)) if bias else (None, None)

    def block(cpu_kernels: bool) -> MoEBlock:
        return MoEBlock(
            spec, "silu", Linear(router), gu, dn, *b, ExpertCounter("cpu"), cpu_kernels=cpu_kernels
        )

    c, ref = block(True), block(False)
    assert c.panels is not None and ref.panels is None
    ops = make_ops(torch.device("cpu"), torch.float32, True)
    h = torch.randn(37, H)
    got = c(h, ops)
    assert (got - ref(h, TorchOps())).abs().max() < 1e-5
    assert torch.equal(got[:5], c(h[:5], ops)) and torch.equal(got[20:21], c(h[20:21], ops))
