"""Mixtures of experts (Mixtral, Qwen3-MoE, OLMoE, gpt-oss) beyond the float32 equality of
tests/engine/models/test_families.py: bf16 and INT8 against transformers, a mixed batch whose
requests share some experts and not others, the per-step expert stats, and what is refused (LoRA
adapters, MXFP4 experts), and the triton backend with the fused-MoE kernel."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from functools import partial

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.lora import AdapterBaseMismatchError
from engine.models import UnsupportedModelError, check_folder
from tests.engine.hf_reference import hf_greedy
from tests.engine.models.families import MOE, load_hf, save_family
from tests.engine.models.test_families import PROMPTS


def _logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def moe_reference(tmp_path_factory):
    """family -> (folder, [fp32 prompt logprobs], [transformers' own bf16 error from them]) per prompt."""
    cache = {}

    def get(name: str):
        if name not in cache:
            folder = save_family(name, tmp_path_factory.mktemp(name))
            hf = load_hf(folder)
            hf16 = AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.bfloat16, attn_implementation="eager"
            ).eval()
            want = [_logprobs(hf, ids) for ids in PROMPTS]
            hf_err = [(_logprobs(hf16, ids) - lp).abs() for ids, lp in zip(PROMPTS, want)]
            cache[name] = (folder, want, hf_err)
        return cache[name]

    return get


def _prompt_logprobs(llm: LLM) -> list[torch.Tensor]:
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    return [torch.tensor([x.logprob for x in out.prompt_logprobs[1:]]) for out in outs]


@pytest.mark.parametrize("family", MOE)
def test_bf16_is_as_close_to_float32_as_transformers_bf16(moe_reference, family):
    """A router near-tie can pick another expert in bf16 (transformers' own bf16 forward is 0.43 nats
    off at one position of the Mixtral checkpoint): bf16 is held to transformers' own bf16 error
    + 0.1 nats at its worst position, and to 0.05 nats on average."""
    folder, want, hf_err = moe_reference(family)
    llm = LLM(model=str(folder), dtype="bfloat16", num_threads=2, num_kv_blocks=64)
    for got, lp, err in zip(_prompt_logprobs(llm), want, hf_err):
        ours = (got - lp).abs()
        assert ours.max() < err.max() + 0.1, family
        assert ours.mean() < 0.05, family


@pytest.mark.parametrize("family", MOE)
def test_int8_experts_within_tolerance(moe_reference, family):
    """INT8 experts (per-expert Int8Linear on the INT8 C kernel), router unquantized: measured at most
    0.18 nats from transformers' float32 (OLMoE), 0.02 on average (2026-11-25)."""
    folder, want, _ = moe_reference(family)
    llm = LLM(model=str(folder), dtype="float32", quantization="int8", num_threads=2, num_kv_blocks=64)
    block = next(ly.moe for ly in llm.engine.runner.model.layers if ly.moe is not None)
    assert block.linears is not None and block.linears[0][0].has_cpu_kernel  # the INT8 kernel runs
    for got, lp in zip(_prompt_logprobs(llm), want):
        assert (got - lp).abs().max() < 0.25, family
        assert (got - lp).abs().mean() < 0.04, family


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("family", MOE)
def test_mixed_batch_gives_each_request_its_solo_tokens(moe_reference, family, backend):
    """Requests decoded together (their tokens grouped by expert, some experts shared by several
    requests, others used by one) get the tokens each gets alone."""
    folder, _, _ = moe_reference(family)
    llm = LLM(model=str(folder), dtype="float32", attention_backend=backend, num_threads=2, num_kv_blocks=128)
    prompts = PROMPTS + [[(13 * i + 1) % 250 + 2 for i in range(n)] for n in (3, 9, 17)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    solo = [llm.generate([p], params)[0].token_ids for p in prompts]
    engine = llm.engine
    block = next(ly.moe for ly in engine.runner.model.layers if ly.moe is not None)
    routed = []  # the first MoE layer's expert ids [T, k] of each decode step of the whole batch
    route = block.route

    def recording_route(h):
        weights, ids = route(h)
        if h.shape[0] == len(prompts) and engine.stats.steps > 0:
            routed.append(ids.tolist())
        return weights, ids

    block.route = recording_route
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id] += out.new_token_ids
    assert [outs[str(i)] for i in range(len(prompts))] == solo
    # the premise: in these steps some experts served several requests and others one
    users = [Counter(e for token in step for e in token) for step in routed]
    assert len(routed) >= 8
    assert any(n > 1 for u in users for n in u.values()) and any(n == 1 for u in users for n in u.values())


TRITON_TOKENS = 8  # triton's interpreter takes about a second a step of these models


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_triton_backend_with_the_fused_moe_kernel_equals_transformers(moe_reference, family):
    """The triton attention backend runs the model's MoE layers on the fused-MoE kernel too (here in
    triton's interpreter, TRITON_INTERPRET=1 from tests/engine/conftest.py): float32 greedy tokens
    equal transformers' for 8 tokens, prompt logprobs within 1e-4."""
    folder, want, _ = moe_reference(family)
    tokens = hf_greedy(load_hf(folder), PROMPTS, [TRITON_TOKENS] * len(PROMPTS))
    llm = LLM(model=str(folder), dtype="float32", attention_backend="triton", num_threads=2, num_kv_blocks=64)
    blocks = [ly.moe for ly in llm.engine.runner.model.layers if ly.moe is not None]
    calls = []
    for block in blocks:
        assert block.fused is not None and block.panels is None and block.linears is None
        block.fused = partial(lambda fused, *a, **kw: calls.append(1) or fused(*a, **kw), block.fused)
    params = SamplingParams(max_tokens=TRITON_TOKENS, temperature=0, ignore_eos=True, prompt_logprobs=0)
    outs = llm.generate(PROMPTS, params)
    assert len(calls) >= len(blocks) * TRITON_TOKENS
    for out, want_tokens, lp in zip(outs, tokens, want):
        got = torch.tensor([x.logprob for x in out.prompt_logprobs[1:]])
        assert (got - lp).abs().max() < 1e-4, family
        assert out.token_ids == want_tokens, family


def test_step_stats_count_experts_and_bytes(moe_reference):
    """A batch-1 decode step of Mixtral (top-2 of 8, 3 layers) runs 2 experts a layer: 6, and reads
    the dense weights plus those 6 experts' bytes."""
    folder, _, _ = moe_reference("mixtral")
    llm = LLM(model=str(folder), dtype="float32", num_threads=2, num_kv_blocks=32)
    llm.generate([PROMPTS[0]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    stats, model = llm.engine.stats, llm.engine.runner.model
    assert stats.last_step_experts_touched == 6
    block = model.layers[0].moe
    assert block.expert_bytes == 4 * (2 * 128 * 64 + 64 * 128)  # fp32 gate_up + down
    assert stats.last_step_weight_bytes == model.dense_weight_bytes + 6 * block.expert_bytes
    assert stats.experts_touched >= 3 * 6 and stats.weight_bytes_read > stats.last_step_weight_bytes


def test_lora_adapter_on_a_moe_model_is_refused(moe_reference, tmp_path):
    from tests.engine.lora.lora_adapters import AdapterRecipe, make_adapter

    folder, _, _ = moe_reference("qwen3_moe")
    adapter = make_adapter(load_hf(folder), AdapterRecipe("a", 4, 8.0, ("q_proj",), seed=1), tmp_path)
    llm = LLM(model=str(folder), dtype="float32", num_threads=2, num_kv_blocks=16)
    with pytest.raises(AdapterBaseMismatchError, match="mixture-of-experts models are not supported"):
        llm.engine.check_lora(adapter)


def _edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_gpt_oss_is_served_in_bf16_weights_and_refused_in_mxfp4(moe_reference, tmp_path):
    """Its sink logits stay fp32 in a bf16 model; MXFP4-quantized experts are refused."""
    folder, _, _ = moe_reference("gpt_oss")
    check_folder(folder)
    llm = LLM(model=str(folder), dtype="bfloat16", num_threads=2, num_kv_blocks=16)
    sinks = [ly.sinks for ly in llm.engine.runner.model.layers]
    assert all(s is not None and s.dtype == torch.float32 and s.shape == (4,) for s in sinks)
    mxfp4 = shutil.copytree(folder, tmp_path / "mxfp4")
    _edit_config(mxfp4, quantization_config={"quant_method": "mxfp4"})
    with pytest.raises(UnsupportedModelError, match="MXFP4-quantized expert weights"):
        check_folder(mxfp4)


def test_checkpoint_missing_an_expert_or_with_an_extra_one_is_refused(moe_reference, tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _, _ = moe_reference("olmoe")
    sd = load_file(folder / "model.safetensors")
    del sd["model.layers.1.mlp.experts.5.up_proj.weight"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((folder / "config.json").read_text())
    save_file(sd, str(broken / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match="lacks 1 tensor"):
        check_folder(broken)
    # an extra expert the config does not count is a tensor we would not read
    sd["model.layers.1.mlp.experts.5.up_proj.weight"] = sd[
        "model.layers.1.mlp.experts.4.up_proj.weight"
    ].clone()
    sd["model.layers.0.mlp.experts.8.up_proj.weight"] = sd[
        "model.layers.1.mlp.experts.4.up_proj.weight"
    ].clone()
    save_file(sd, str(broken / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match="would not read"):
        check_folder(broken)
