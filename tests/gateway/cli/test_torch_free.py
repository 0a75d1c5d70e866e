"""The gateway's process runs without torch (gateway/cli/torch_free.py): after ``torch_free()`` the
model check and the tokenizer load through transformers' torch-less path, give the same spec and
the same token ids as in a process with torch, and an import of torch fails instead of loading it;
a process that has torch already is left as it is; a GGUF file whose tokenizer is not converted yet
is read with torch, once."""

from __future__ import annotations

import json
import shutil
import sys

from benchmarks.common import tiny_model
from engine import assets
from engine.models.check import check_folder
from gateway.cli.torch_free import tokenizer_without_torch, torch_free
from tests.fresh_python import run_fresh

TEXTS = ["The quick brown fox, in 3 words: jumps über everything.", "<|im_start|>user\nhi<|im_end|>\n"]
CHAT = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi <|im_end|> there"}]

CHECK = """
import json, sys
from gateway.cli.torch_free import tokenizer_without_torch, torch_free
from tests.fresh_python import run_fresh
assert torch_free()
from engine import assets
from engine.models.check import check_folder
folder, texts, chat = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
spec = check_folder(folder)
tokenizer = assets.load_tokenizer(folder)
try:
    import torch  # noqa: F401
    imported = "imported"
except ImportError:
    imported = "refused"
print(json.dumps({
    "family": spec.family,
    "class": type(tokenizer).__name__,
    "texts": [assets.encode_prompt(tokenizer, t) for t in texts],
    "chat": assets.encode_chat(tokenizer, chat),
    "torch": imported,
    "loaded": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
}))
"""


def test_the_check_and_the_tokenizer_without_torch_equal_them_with_it():
    folder = tiny_model()
    done = run_fresh(CHECK, folder, json.dumps(TEXTS), json.dumps(CHAT))
    assert "PyTorch was not found" not in done.stderr  # transformers' notice, filtered
    seen = json.loads(done.stdout.splitlines()[-1])
    tokenizer = assets.load_tokenizer(folder)  # this process has torch
    assert seen["torch"] == "refused" and seen["loaded"] == ["torch"]  # only the None marker
    assert seen["family"] == check_folder(folder).family
    assert seen["class"] == type(tokenizer).__name__
    assert seen["texts"] == [assets.encode_prompt(tokenizer, t) for t in TEXTS]
    assert seen["chat"] == assets.encode_chat(tokenizer, CHAT)


def test_a_process_with_torch_loaded_is_left_as_it_is():
    import torch

    assert torch_free() is False and sys.modules["torch"] is torch


def test_a_gguf_whose_tokenizer_is_not_converted_yet_keeps_torch(tmp_path, monkeypatch):
    """transformers reads a GGUF file's tokenizer only with torch: the first gateway converts it."""
    source = assets.resolve_model("smollm2")
    converted = next(
        d for d in (assets.converted_dir(source), assets.tokenizer_dir(source)) if assets.has_tokenizer(d)
    )
    folder = tiny_model()  # (in the real cache)
    monkeypatch.setenv(assets.CACHE_ENV, str(tmp_path))  # a model cache that has nothing yet
    assert tokenizer_without_torch("smollm2") is False
    assert tokenizer_without_torch(str(source.files)) is False  # the same file named by its path
    assert tokenizer_without_torch(folder) and tokenizer_without_torch("dummy")
    shutil.copytree(converted, assets.tokenizer_dir(source))  # what the first gateway writes
    assert tokenizer_without_torch("smollm2") is True
