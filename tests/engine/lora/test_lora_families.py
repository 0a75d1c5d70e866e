"""PEFT adapters on other families than Llama (tiny random Qwen3, Gemma 2 and Phi-3 checkpoints with
their switches on): our logits over a prompt equal PEFT's. Phi-3's adapters target its fused
qkv_proj and gate_up_proj, each the whole of our fused projection."""

import pytest
from lora_adapters import AdapterRecipe, PeftReference, engine_prefill_logits, make_adapter

from engine import Engine, LoRARequest
from engine.lora import ModelShape
from engine.lora.adapter import inspect_adapter_dir
from engine.lora.errors import UnsupportedTargetModuleError
from tests.engine.models.families import load_hf, save_family

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FUSED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # Phi-3's linear modules
TARGETS = {"qwen3": ALL, "gemma2": ALL, "phi3": FUSED}
PROMPT = [(3 * i + 7) % 250 + 2 for i in range(19)]  # longer than the sliding window


@pytest.mark.parametrize("family", sorted(TARGETS))
def test_adapter_logits_equal_peft(tmp_path, family):
    folder = save_family(family, tmp_path / family)
    adapter = make_adapter(load_hf(folder), AdapterRecipe("all", 4, 8, TARGETS[family], 1, 0.2), tmp_path)
    peft = PeftReference(load_hf(folder), [adapter])
    eng = Engine(model=str(folder), dtype="float32", max_loras=1, max_lora_rank=4, num_kv_blocks=32)
    ours = engine_prefill_logits(eng, [("r", PROMPT, LoRARequest("a", str(adapter)))])["r"]
    ref = peft.logits(adapter, PROMPT)
    assert (ours - ref).abs().max().item() < 1e-4
    assert (ref - peft.logits(None, PROMPT)).abs().max().item() > 1e-2  # the adapter changes them


def test_an_adapter_of_the_other_layout_is_refused_naming_the_base_modules(tmp_path):
    """q/k/v adapters on Phi-3 (whose checkpoint fuses them) and a qkv_proj adapter on Qwen3."""
    for family, other, targets in (("phi3", "qwen3", ("q_proj", "v_proj")), ("qwen3", "phi3", FUSED)):
        base = load_hf(save_family(other, tmp_path / other))
        adapter = make_adapter(base, AdapterRecipe(f"{other}-lora", 4, 8, targets, 1), tmp_path)
        shape = ModelShape.from_config(load_hf(save_family(family, tmp_path / family)).config)
        with pytest.raises(UnsupportedTargetModuleError, match="not modules of the base model") as err:
            inspect_adapter_dir(adapter, shape, max_rank=4)
        assert f"({family}: {', '.join(TARGETS[family])})" in str(err.value)
