"""Compiles while serving: after the warm-up (engine/kernels/warmup.py) no step launches a Triton
variant the warm-up did not compile. The variant of a launch is the key Triton's launcher looks it
up by, computed for sm_90 (engine/kernels/variants.py); 200 steps of mixed decodes, prefill chunks,
growing block tables and changing batch sizes must add none. The keys come from the real arguments
of every launch; the kernels themselves are not run there (ignore_eos: the schedule does not depend
on the tokens), which keeps 200 steps to seconds."""

from __future__ import annotations

import random

import torch
from kernel_reference import DEVICE

from engine import LLM, SamplingParams
from engine.attention import AttentionMetadata
from engine.kernels import paged_decode
from engine.kernels.fused_ops import TritonOps
from engine.kernels.variants import VariantLog, specialization_key
from engine.kernels.warmup import warm_up

SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
)


def _llm(**kw) -> LLM:
    """SHAPE on the Triton backend (the GPU where there is one, else the interpreter), eager steps:
    graph replays launch nothing from Python, so every step's launches are seen."""
    args = dict(
        model="dummy",
        dummy_config=SHAPE,
        device=DEVICE.type,
        cuda_graphs=False,
        dtype="float32",
        attention_backend="triton",
        cpu_kernels=False,
        block_size=16,
        kv_cache_gib=0.01,
    )
    return LLM(**{**args, **kw})


def test_per_step_ints_do_not_make_new_variants():
    # the block-table width and the split count change every step; neither may pick a variant
    k = paged_decode._decode_kernel
    keys = set()
    for width, splits in [(1, 1), (16, 1), (17, 2), (32, 16), (33, 3)]:
        q, cache = torch.zeros(2, 4, 64), torch.zeros(2, 2, 64, 64)
        tables, ctx, out = torch.zeros(2, width, dtype=torch.int64), torch.ones(2, dtype=torch.int64), q
        part = torch.zeros(2, 4, splits, 64)
        keys.add(
            specialization_key(
                k, q, cache, tables, ctx, out, part, part[..., 0], None, 0.125, splits, 0, 0.0,
                *[q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), cache.stride(2)],
                *[tables.stride(0), out.stride(0), out.stride(1), 4 * splits * 64, splits * 64, 64],
                G=2, G_PAD=16, D=64, BLOCK_SIZE=16, BLOCK_N=64, FP32=True, PRECISION="ieee", SOFTCAP=False,
                HAS_SINKS=False, num_warps=4,
            )
        )  # fmt: skip
    assert len(keys) == 1


def test_variant_count_after_warm_up_is_stable_over_200_steps():
    llm = _llm(max_num_seqs=8, max_num_batched_tokens=48)
    runner = llm.engine.runner
    runner.model.ops = TritonOps()  # the CUDA operators, here in the interpreter
    log = VariantLog(execute=False)  # keys of the real arguments; 200 interpreted steps take minutes
    try:
        warm_up(runner.model, runner.kv_caches, runner.block_size)
        warmed = log.counts()
        assert set(warmed) == {
            "_kv_write_kernel",
            "_decode_kernel",
            "_reduce_kernel",
            "_prefill_kernel",
            "_add_rms_norm_kernel",
            "_rope_kernel",
            "_silu_mul_kernel",
        }
        eng, rng = llm.engine, random.Random(0)
        for step in range(200):
            if eng.num_running < 6 and rng.random() < 0.5:
                prompt = [rng.randrange(2, 128) for _ in range(rng.choice([1, 5, 16, 17, 40, 70]))]
                params = SamplingParams(max_tokens=rng.randrange(1, 40), temperature=0, ignore_eos=True)
                eng.add_request(f"r{step}", prompt, params)
            eng.step()
        assert log.launches["_decode_kernel"] > 100 and log.launches["_prefill_kernel"] > 20
        assert log.counts() == warmed
    finally:
        log.close()


def test_warm_up_compiles_the_split_decode_with_sinks_where_layers_have_them():
    llm = _llm()
    runner = llm.engine.runner
    attention = runner.model.attention
    log = VariantLog(execute=False)
    try:
        warm_up(runner.model, runner.kv_caches, runner.block_size)
        assert log.counts()["_reduce_kernel"] == 1  # no layer has sinks: no sink variant
        q = torch.zeros(1, 4, 16, device=DEVICE)
        kv = torch.zeros(1, 2, 16, device=DEVICE)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor([-1], device=DEVICE),
            block_size=16,
            num_decodes=1,
            decode_block_tables=torch.zeros(1, 1, dtype=torch.int64, device=DEVICE),
            decode_context_lens=torch.zeros(1, dtype=torch.int64, device=DEVICE),
            prefills=[],
        )
        sinks = torch.zeros(4, device=DEVICE)
        attention.forward(q, kv, kv, runner.kv_caches[0], meta, sinks=sinks)  # a layer with sinks
        warm_up(runner.model, runner.kv_caches, runner.block_size)
        assert log.counts()["_reduce_kernel"] == 2 and log.counts()["_decode_kernel"] == 2
    finally:
        log.close()


def test_warm_up_compiles_every_fused_moe_tile_config(tmp_path):
    """A MoE model's warm-up runs the fused-MoE kernel in each tile config (decode-sized and
    prefill-sized batches pick different ones): steps of 1 to 70 tokens add no variant."""
    from engine.kernels.fused_moe import CONFIGS
    from tests.engine.models.families import save_family

    folder = save_family("mixtral", tmp_path / "mixtral")  # 8 experts, top-2: > 64 tokens is prefill-sized
    llm = LLM(
        model=str(folder),
        dtype="float32",
        attention_backend="triton",
        cpu_kernels=False,
        block_size=16,
        max_num_batched_tokens=128,
        num_kv_blocks=64,
        cuda_graphs=False,  # graph replays launch nothing from Python: every step counted
    )
    runner = llm.engine.runner
    log = VariantLog(execute=False)
    try:
        warm_up(runner.model, runner.kv_caches, runner.block_size)
        warmed = log.counts()
        assert warmed["_moe_gate_up_kernel"] == warmed["_moe_down_kernel"] == len(CONFIGS)
        eng, rng = llm.engine, random.Random(0)
        for step in range(30):
            if eng.num_running < 4 and rng.random() < 0.5:
                prompt = [rng.randrange(2, 250) for _ in range(rng.choice([1, 5, 17, 70, 100]))]
                params = SamplingParams(max_tokens=rng.randrange(1, 20), temperature=0, ignore_eos=True)
                eng.add_request(f"r{step}", prompt, params)
            eng.step()
        assert log.launches["_moe_gate_up_kernel"] > 30
        assert log.counts() == warmed
    finally:
        log.close()


def test_warm_up_runs_over_the_torch_backend_and_leaves_no_request_wrong():
    """The torch reference backend writes the cache with index_copy_, which refuses slot -1 (on
    CUDA a device-side assert that poisons the process): its warm-up writes block 0 instead, before
    any request holds it, and the engine's greedy tokens are those of an engine with no warm-up."""
    outs = []
    for warm in (True, False):
        llm = _llm(attention_backend="torch")
        runner = llm.engine.runner
        if warm:
            warm_up(runner.model, runner.kv_caches, runner.block_size)
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        outs.append([c.token_ids for c in llm.generate([[2, 3, 4] * 7, [5] * 40], params)])
    assert outs[0] == outs[1] and all(len(t) == 6 for t in outs[0])
