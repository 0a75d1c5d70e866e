"""The one-call decode forward (engine/models/decode.py) against the per-operator forward: the same
kernels in the same order (in bf16, the torch ops' rounding points), so the hidden states and the KV
cache it writes are bit-identical."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.bf16_linear import bf16_library
from engine.models.linear import _onednn_pack

needs_bf16_kernel = pytest.mark.skipif(bf16_library() is None, reason="the CPU lacks AVX512-BF16 and AVX2")
# oneDNN packs bf16 weights only with AVX512 (BW, VL, DQ) or AVX-NE-CONVERT: on AVX2 CPUs `cpu_amx`
# has no oneDNN copy to hand rows to, and every bf16 linear is the C kernel's
needs_onednn_bf16 = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or _onednn_pack(torch.zeros(32, 32).bfloat16(), None) is None,
    reason="oneDNN packs no bf16 weights on this CPU",
)
needs_amx = pytest.mark.skipif(
    bf16_library() is None or not bf16_library().bf16_amx_available(), reason="the CPU lacks AMX"
)


def _decode_plan(llm: LLM, prompts: list[list[int]]):
    """Prefill `prompts`, then the next step's plan: every sequence decodes one token."""
    engine = llm.engine
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    while engine.scheduler.num_waiting or any(
        s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running
    ):
        engine.step()
    engine.step()  # one decode step through the engine
    plan = engine.scheduler.schedule()
    assert plan.scheduled and all(it.is_decode for it in plan.scheduled)
    return plan


@pytest.mark.parametrize(
    "dtype, quantization, amx",
    [
        ("float32", None, False),
        ("float32", "int8", False),
        pytest.param("bfloat16", None, False, marks=needs_bf16_kernel),
        pytest.param("bfloat16", None, None, marks=needs_amx),
    ],
)
@pytest.mark.parametrize("batch", [1, 5])
def test_one_call_equals_the_per_operator_forward(tiny_model_dir, dtype, quantization, amx, batch):
    # cpu_amx off: the per-operator forward's bf16 linears all run the C kernel, as the one call's do;
    # on (AMX CPUs): from 3 rows both run bf16_amx.c's tiles
    llm = LLM(
        model=str(tiny_model_dir),
        dtype=dtype,
        num_threads=2,
        quantization=quantization,
        cpu_amx=amx,
        kv_cache_gib=0.01,  # each forward below zeroes the whole cache first
    )
    runner, model = llm.engine.runner, llm.engine.runner.model
    assert model.decode is not None and model.decode.int8 == (quantization == "int8")
    assert model.decode.bf16 == (dtype == "bfloat16")
    assert (model.decode.struct.amx_min_rows, model.decode.struct.amx_max_rows) == (
        (3, 32) if amx is None else (0, 0)
    )
    plan = _decode_plan(llm, [list(range(3 + i, 20 + 7 * i)) for i in range(batch)])
    results = []
    for decode in (model.decode, None):
        for cache in runner.kv_caches:
            cache.zero_()  # each forward rewrites the step's K/V rows: compare what each one wrote
        model.decode = decode
        items, hidden, _ = runner.forward(plan)
        results.append((hidden.clone(), [c.clone() for c in runner.kv_caches]))
    (one_call, caches), (per_op, per_op_caches) = results
    assert one_call.shape == (batch, model.config.hidden_size) and one_call.dtype == model.dtype
    assert torch.equal(one_call, per_op)
    assert all(torch.equal(a, b) for a, b in zip(caches, per_op_caches))
    assert any(c.abs().sum() > 0 for c in caches)


def test_where_it_applies(tiny_model_dir):
    fp32 = LLM(model=str(tiny_model_dir), dtype="float32", num_threads=2)
    decode = fp32.engine.runner.model.decode
    assert decode is not None
    # a step with a prefill takes the per-operator forward
    fp32.engine.add_request("p", list(range(3, 30)), SamplingParams(max_tokens=2))
    plan = fp32.engine.scheduler.schedule()
    meta = fp32.engine.runner._prepare(plan.scheduled)[2]
    assert meta.prefills and not decode.applies(meta, fp32.engine.runner.kv_caches)
    fp32.engine.abort("p")
    for kw in (
        {"cpu_kernels": False},
        {"dtype": "bfloat16", "cpu_kernels": False},
        {"attention_backend": "torch"},
        {"dtype": "bfloat16", "attention_backend": "torch"},
    ):
        llm = LLM(model=str(tiny_model_dir), num_threads=2, **{"dtype": "float32", **kw})
        assert llm.engine.runner.model.decode is None, kw
    # bf16 takes it where its projections run the AVX512-BF16 kernel
    bf16 = LLM(model=str(tiny_model_dir), dtype="bfloat16", num_threads=2).engine.runner.model
    assert (bf16.decode is not None) == (bf16_library() is not None)


@needs_bf16_kernel
@needs_onednn_bf16
def test_with_amx_linears_the_one_call_takes_small_batches_only(tiny_model_dir):
    """Where oneDNN's AMX linears take calls of many rows, a decode step of 8 rows or more runs the
    per-operator forward (faster there), fewer rows the one call."""
    llm = LLM(model=str(tiny_model_dir), dtype="bfloat16", num_threads=2, cpu_amx=True)
    decode = llm.engine.runner.model.decode
    assert decode is not None and decode.max_rows == 8
    for batch, applies in ((7, True), (8, False)):
        plan = _decode_plan(llm, [list(range(3 + i, 12 + i)) for i in range(batch)])
        meta = llm.engine.runner._prepare(plan.scheduled)[2]
        assert decode.applies(meta, llm.engine.runner.kv_caches) == applies
        for i in range(batch):
            llm.engine.abort(f"r{i}")
    assert (
        LLM(model=str(tiny_model_dir), dtype="bfloat16", cpu_amx=False).engine.runner.model.decode.max_rows
        is None
    )
