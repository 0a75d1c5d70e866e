"""Engine fixtures: a tiny random-weight Llama (GQA) saved as a HF folder, and the real SmolLM2."""

from __future__ import annotations

import os
from pathlib import Path

import torch

# Without a GPU the Triton kernels (tests/engine/kernels, tests/engine/attention) run in triton's CPU
# interpreter. Triton reads the switch when a kernel is defined, and transformers imports triton
# (below), so it is set here, before that; nothing else runs triton kernels on a CPU-only machine.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from paths import EnginePath
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from engine import LLM

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    eos_token_id=1,
    bos_token_id=0,
    pad_token_id=0,
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    torch.manual_seed(1234)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_hf(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2() -> LLM:
    return LLM(model="smollm2", dtype="float32", num_threads=2)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2):
    return AutoModelForCausalLM.from_pretrained(smollm2.engine.model_path, dtype=torch.float32).eval()


def pytest_collection_modifyitems(config, items):
    """Each test that runs an engine path (tests/engine/paths.py) carries its name as a user property:
    its reports take it to the root conftest's summary, across pytest-xdist's workers too."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        for value in callspec.params.values() if callspec else ():
            if isinstance(value, EnginePath):
                item.user_properties.append(("engine_path", value.name))
