"""Adapter validation: every bad adapter is a named AdapterError saying what is wrong, raised
before anything is queued. Real PEFT adapters of the tiny test model, broken on purpose."""

import json
import shutil

import pytest
import torch
from lora_adapters import AdapterRecipe, make_adapter
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from engine import Engine, SamplingParams
from engine.lora import (
    AdapterBaseMismatchError,
    AdapterConfigError,
    AdapterNotFoundError,
    AdapterRankError,
    AdapterWeightsError,
    LoRADisabledError,
    ModelShape,
    UnsupportedAdapterError,
    UnsupportedTargetModuleError,
    inspect_adapter_dir,
)

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def shape(base):
    return ModelShape.from_config(base.config)


@pytest.fixture(scope="module")
def good(base, tmp_path_factory):
    return make_adapter(base, AdapterRecipe("good", 8, 16, ALL, 1), tmp_path_factory.mktemp("adapters"))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Engine(model=str(tiny_model_dir), dtype="float32", max_loras=2, max_lora_rank=8)


def broken(good, tmp_path, *, config=None, weights=None):
    """A copy of the good adapter with its config patched and/or its tensors replaced."""
    path = tmp_path / "broken"
    shutil.copytree(good, path)
    if config is not None:
        cfg = json.loads((path / "adapter_config.json").read_text())
        cfg.update(config)
        (path / "adapter_config.json").write_text(json.dumps(cfg))
    if weights is not None:
        tensors = weights(load_file(path / "adapter_model.safetensors"))
        save_file(tensors, path / "adapter_model.safetensors")
    return path


def test_good_adapter_spec(good, shape):
    spec = inspect_adapter_dir(good, shape, max_rank=8)
    assert (spec.rank, spec.alpha, spec.scaling) == (8, 16.0, 2.0)
    assert spec.target_modules == ALL and spec.layers == (0, 1, 2)
    assert spec.size_bytes == sum(
        f.stat().st_size for f in good.iterdir() if f.suffix in (".json", ".safetensors")
    )


@pytest.mark.parametrize(
    "case, error, words",
    [
        ("no_config", AdapterNotFoundError, "adapter_config.json"),
        ("no_weights", AdapterNotFoundError, "adapter_model.safetensors"),
        ("bad_json", AdapterConfigError, "not valid JSON"),
        ("rank", AdapterRankError, "r=8 is over this engine's max_lora_rank=4"),
        ("dora", UnsupportedAdapterError, "use_dora"),
        ("lm_head", UnsupportedTargetModuleError, "lm_head"),
        ("truncated", AdapterWeightsError, "truncated"),
        ("missing_tensor", AdapterWeightsError, "layers.1.self_attn.v_proj.lora_B.weight is missing"),
        ("wrong_rank_tensor", AdapterWeightsError, "expected [8, 64]"),
    ],
)
def test_bad_adapters_are_named_errors(good, shape, tmp_path, case, error, words):
    max_rank = 4 if case == "rank" else 8
    if case == "no_config":
        path = broken(good, tmp_path)
        (path / "adapter_config.json").unlink()
    elif case == "no_weights":
        path = broken(good, tmp_path)
        (path / "adapter_model.safetensors").unlink()
    elif case == "bad_json":
        path = broken(good, tmp_path)
        (path / "adapter_config.json").write_text("{not json")
    elif case in ("rank", "dora"):
        path = broken(good, tmp_path, config={"use_dora": True} if case == "dora" else {})
    elif case == "lm_head":
        path = broken(good, tmp_path, config={"target_modules": ["q_proj", "lm_head"]})
    elif case == "truncated":
        path = broken(good, tmp_path)
        data = (path / "adapter_model.safetensors").read_bytes()
        (path / "adapter_model.safetensors").write_bytes(data[: len(data) - 100])
    elif case == "missing_tensor":
        gone = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
        path = broken(good, tmp_path, weights=lambda t: {k: v for k, v in t.items() if k != gone})
    else:
        key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        path = broken(good, tmp_path, weights=lambda t: {**t, key: t[key][:4].contiguous()})
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")) as info:
        inspect_adapter_dir(path, shape, max_rank=max_rank)
    assert info.value.param in ("adapter_config", "adapter_model")


def test_adapter_of_another_base_model_is_refused(tmp_path, shape):
    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    path = make_adapter(other, AdapterRecipe("other", 4, 8, ("q_proj",), 2), tmp_path)
    with pytest.raises(AdapterBaseMismatchError, match="q_proj maps 64 -> 64"):
        inspect_adapter_dir(path, shape, max_rank=8)
    deeper = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    path = make_adapter(deeper, AdapterRecipe("deeper", 4, 8, ("q_proj",), 2), tmp_path)
    with pytest.raises(AdapterBaseMismatchError, match="layer 3, but the base model has 3 layers"):
        inspect_adapter_dir(path, shape, max_rank=8)


def test_engine_refuses_a_bad_adapter_and_keeps_nothing(engine, good, tmp_path):
    path = broken(good, tmp_path, config={"r": 16})
    with pytest.raises(AdapterRankError) as info:
        engine.add_request("bad", [3, 4, 5], SamplingParams(max_tokens=2), lora=str(path))
    assert info.value.code == "adapter_rank_too_large"
    with pytest.raises(AdapterNotFoundError):
        engine.add_request("bad", [3, 4, 5], SamplingParams(max_tokens=2), lora=str(tmp_path / "nowhere"))
    assert not engine.seqs and engine.num_waiting == 0 and not engine.lora.pins


def test_engine_without_lora_slots_names_it(tiny_model_dir, good):
    eng = Engine(model=str(tiny_model_dir), dtype="float32", max_loras=0)
    with pytest.raises(LoRADisabledError, match="max_loras=0"):
        eng.add_request("x", [3, 4], SamplingParams(max_tokens=2), lora=str(good))
