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

_PATH_OF_TEST: dict[str, str] = {}  # nodeid -> the engine path it runs (tests/engine/paths.py)
_PATH_OUTCOMES: dict[str, dict[str, int]] = {}  # path -> outcome -> count

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
    for item in items:
        callspec = getattr(item, "callspec", None)
        for value in callspec.params.values() if callspec else ():
            if isinstance(value, EnginePath):
                _PATH_OF_TEST[item.nodeid] = value.name


def pytest_runtest_logreport(report):
    path = _PATH_OF_TEST.get(report.nodeid)
    if path is not None and (report.when == "call" or report.outcome != "passed"):
        counts = _PATH_OUTCOMES.setdefault(path, {})
        counts[report.outcome] = counts.get(report.outcome, 0) + 1


def pytest_terminal_summary(terminalreporter):
    """Which numeric paths (tests/engine/paths.py) this run exercised, and how."""
    if not _PATH_OUTCOMES:
        return
    terminalreporter.section("engine paths run")
    for path, counts in sorted(_PATH_OUTCOMES.items()):
        outcomes = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        terminalreporter.write_line(f"{path}: {outcomes}")
