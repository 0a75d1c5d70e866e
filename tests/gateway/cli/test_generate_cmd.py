"""`fairlane generate` as a user runs it: a JSONL in, a JSONL out, resumable."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=1,
    )
    path = tmp_path_factory.mktemp("cli-model")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def run(model, inp, out):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "generate",
            "--model",
            str(model),
            "--input",
            str(inp),
            "--output",
            str(out),
            "--dtype",
            "float32",
            "--kv-cache-gib",
            "0.01",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_generate_writes_results_and_errors_then_resumes(tiny_model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    reqs = [
        {"id": "a", "prompt_token_ids": [5, 6, 7], "max_tokens": 6, "ignore_eos": True},
        {"id": "b", "prompt_token_ids": [9, 10], "max_tokens": 4, "ignore_eos": True},
        {"id": "bad", "prompt_token_ids": [3], "max_tokens": 0},
    ]
    inp.write_text("\n".join(json.dumps(r) for r in reqs) + "\nnot json\n")
    first = run(tiny_model, inp, out)
    assert first.returncode == 1, first.stderr  # errors are reported, not fatal
    got = {r["id"]: r for r in lines(out)}
    assert set(got) == {"a", "b", "bad", "line-4"}
    assert len(got["a"]["token_ids"]) == 6 and got["a"]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 6,
    }
    assert got["bad"]["error"]["param"] == "max_tokens"
    assert "invalid JSON" in got["line-4"]["error"]["message"]

    with inp.open("a") as f:
        f.write(
            json.dumps({"id": "c", "prompt_token_ids": [11, 12], "max_tokens": 3, "ignore_eos": True}) + "\n"
        )
    second = run(tiny_model, inp, out)
    assert second.returncode == 0, second.stderr
    ids = [r["id"] for r in lines(out)]
    assert sorted(ids) == ["a", "b", "bad", "c", "line-4"]  # each id exactly once
    third = run(tiny_model, inp, out)
    assert third.returncode == 0 and "nothing to do" in third.stderr
