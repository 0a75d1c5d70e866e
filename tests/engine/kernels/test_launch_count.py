"""Kernel launches of a decode step on the GPU path: the triton attention backend and the fused
elementwise kernels (engine/kernels/fused_ops.py), counted over the model's forward (torch ops that
compute, one each; a Triton kernel, one each; views and allocations, none). At most 12 a layer,
so a 1B shape's decode step is a few hundred launches and a CUDA graph of it replays cheaply."""

from __future__ import annotations

from kernel_reference import DEVICE

from engine import LLM, SamplingParams
from engine.kernels.fused_ops import TritonOps
from engine.kernels.variants import LaunchCounter
from engine.models.fused import TorchOps

LAYERS = 3
SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
)


def decode_forward_launches(ops) -> LaunchCounter:
    llm = LLM(
        model="dummy",
        dummy_config=SHAPE,
        device=DEVICE.type,
        dtype="float32",
        attention_backend="triton",
        cpu_kernels=False,
        block_size=16,
        kv_cache_gib=0.01,
    )
    runner = llm.engine.runner
    runner.model.ops = ops
    eng = llm.engine
    for i in range(3):  # three sequences, prefilled, then one decode step counted
        eng.add_request(
            f"r{i}", [2 + t % 100 for t in range(10 + 20 * i)], SamplingParams(max_tokens=8, ignore_eos=True)
        )
    while not all(s.num_output_tokens > 0 for s in eng.seqs.values()):
        eng.step()
    plan = eng.scheduler.schedule()
    assert all(it.is_decode for it in plan.scheduled) and len(plan.scheduled) == 3
    items = sorted(plan.scheduled, key=lambda it: not it.is_decode)
    ids, pos, meta, _ = runner._prepare(items)
    ids, pos, meta = runner._to_device(ids, pos, meta)
    with LaunchCounter() as counter:
        runner.model.forward(ids, pos, meta, runner.kv_caches)
    return counter


def test_decode_step_launches_at_most_12_per_layer_with_the_fused_kernels():
    counter = decode_forward_launches(TritonOps())
    per_layer = (counter.total - 2) / LAYERS  # the embedding and the final norm
    assert counter.ops["triton:_decode_kernel"] == LAYERS
    assert counter.ops["triton:_add_rms_norm_kernel"] == 2 * LAYERS + 1
    assert per_layer <= 12, dict(counter.ops)


def test_the_torch_operators_launch_more():
    counter = decode_forward_launches(TorchOps())
    assert (counter.total - 2) / LAYERS > 12, dict(counter.ops)
