"""Checkpoints we cannot serve exactly are refused before any weight is read, with a message that
names what is unsupported; `fairlane serve` refuses to start with one. The folders here keep only
the safetensors header (no tensor data): reading a weight would fail with another error."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2MoeConfig

from engine import LLM, SamplingParams, UnsupportedModelError
from engine.models.check import check_folder, safetensors_header
from tests.engine.models.families import BASE
from tests.gateway.serve_process import refused_serve


def _header_only(folder: Path) -> None:
    """Cut every .safetensors file after its header: the tensor data is gone."""
    for f in folder.glob("*.safetensors"):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        f.write_bytes(raw[: 8 + n])


def _llama(
    folder: Path, config: dict | None = None, extra: dict | None = None, drop: str | None = None
) -> Path:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**BASE))
    model.save_pretrained(folder)
    if extra or drop:
        sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != drop}
        save_file({**sd, **(extra or {})}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if config:
        raw = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**raw, **config}))
    _header_only(folder)
    return folder


def _refused(folder: Path) -> str:
    with pytest.raises(UnsupportedModelError) as err:
        check_folder(folder)
    with pytest.raises(UnsupportedModelError) as engine_err:  # the engine runs the same check first
        LLM(model=str(folder), dtype="float32", num_threads=1)
    assert str(engine_err.value) == str(err.value)
    return str(err.value)


def test_a_family_we_do_not_serve(tmp_path):
    config = Qwen2MoeConfig(**{**BASE, "num_experts": 2})
    config.save_pretrained(tmp_path)
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    _header_only(tmp_path)
    assert "'qwen2_moe'" in _refused(tmp_path)


@pytest.mark.parametrize("method", ["gptq", "awq", "bitsandbytes"])
def test_quantized_checkpoints_we_cannot_serve_exactly(tmp_path, method):
    message = _refused(_llama(tmp_path, {"quantization_config": {"quant_method": method, "bits": 4}}))
    assert f"quant_method {method!r}" in message


def test_an_activation_we_do_not_implement(tmp_path):
    assert "'laplace'" in _refused(_llama(tmp_path, {"hidden_act": "laplace"}))


def test_a_tensor_we_would_not_read(tmp_path):
    # an MLP bias in a checkpoint whose config says mlp_bias: false
    name = "model.layers.1.mlp.down_proj.bias"
    message = _refused(_llama(tmp_path, extra={name: torch.zeros(BASE["hidden_size"])}))
    assert name in message and "would not read" in message


def test_a_tensor_the_model_needs(tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    message = _refused(_llama(tmp_path, drop=name))
    assert name in message and "lacks" in message


def test_the_check_reads_headers_only(tmp_path):
    folder = _llama(tmp_path)
    assert check_folder(folder).family == "llama"  # passes with no tensor data at all
    assert "model.norm.weight" in safetensors_header(folder / "model.safetensors")


def test_serve_refuses_to_start(tmp_path):
    folder = _llama(tmp_path / "model", {"hidden_act": "laplace"})
    env = {"FAIRLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'fairlane.db'}"}
    output = refused_serve(env, "--model", str(folder))
    assert "cannot serve model" in output and "'laplace'" in output and "Traceback" not in output
    assert not (tmp_path / "fairlane.db").exists()  # nothing started


def test_a_sharded_checkpoint_is_checked_and_read_whole(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**BASE)).eval()
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and len(
        list(tmp_path.glob("*.safetensors"))
    ) > 1
    assert check_folder(tmp_path).family == "llama"
    llm = LLM(model=str(tmp_path), dtype="float32", num_threads=1, num_kv_blocks=16)
    with torch.no_grad():
        want = model(torch.tensor([[5, 6, 7, 8]])).logits[0, -1].argmax().item()
    assert llm.generate([5, 6, 7, 8], SamplingParams(max_tokens=1, temperature=0))[0].token_ids == [want]
