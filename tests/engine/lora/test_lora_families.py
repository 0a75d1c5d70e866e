"""PEFT adapters on other families than Llama (tiny random Qwen3 and Gemma 2 checkpoints with their
switches on): our logits over a prompt equal PEFT's."""

import pytest
from lora_adapters import AdapterRecipe, PeftReference, engine_prefill_logits, make_adapter

from engine import Engine, LoRARequest
from tests.engine.models.families import load_hf, save_family

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPT = [(3 * i + 7) % 250 + 2 for i in range(19)]  # longer than the sliding window


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_adapter_logits_equal_peft(tmp_path, family):
    folder = save_family(family, tmp_path / family)
    adapter = make_adapter(load_hf(folder), AdapterRecipe("all", 4, 8, ALL, 1, 0.2), tmp_path)
    peft = PeftReference(load_hf(folder), [adapter])
    eng = Engine(model=str(folder), dtype="float32", max_loras=1, max_lora_rank=4, num_kv_blocks=32)
    ours = engine_prefill_logits(eng, [("r", PROMPT, LoRARequest("a", str(adapter)))])["r"]
    ref = peft.logits(adapter, PROMPT)
    assert (ours - ref).abs().max().item() < 1e-4
    assert (ref - peft.logits(None, PROMPT)).abs().max().item() > 1e-2  # the adapter changes them
