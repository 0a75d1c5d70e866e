"""`fairlane serve --model <folder>` on families other than Llama, as a user runs it: tiny random
checkpoints of Qwen3, Phi-3 and Gemma 2 (tests/engine/models/families.py, switches on: q/k norms, fused
projections, sliding windows and soft-caps) with a word-level tokenizer of their
256 ids, served over HTTP and asked through the official openai client; greedy replies equal
transformers' greedy generation of the same prompt. A checkpoint we cannot serve stops serve at
start with a message that names why."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from serve_process import free_port, refused_serve, start, wait_ready
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.engine.hf_reference import hf_greedy
from tests.engine.models.families import BASE, load_hf, save_family

MAX_TOKENS = 24
MESSAGES = [{"role": "user", "content": "t40 t41 t97 t12 t200 t13 t77 t8 t150"}]
PROMPT = "t9 t33 t120 t121 t7 t64 t250 t251 t30 t31 t32"
SPECIALS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]  # ids 0..4: bos, eos (BASE), ...
WORDS = ["user", "assistant", "system"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
)


def save_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with one token per id of the tiny vocabulary: "tN" is id N past the
    special and role words, so any id decodes and any reply's text spells its ids back."""
    names = SPECIALS + WORDS
    vocab = {t: i for i, t in enumerate(names)} | {f"t{i}": i for i in range(len(names), BASE["vocab_size"])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<s>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    assert len(tok) == BASE["vocab_size"]
    return tok


def serve_env(tmp: Path, model: Path) -> dict[str, str]:
    return {
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
        "FAIRLANE_ENGINE__MODEL": str(model),
        "FAIRLANE_ENGINE__DTYPE": "float32",
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "64",
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_REDIS_URL": "",  # the embedded server
    }


@pytest.fixture(scope="module", params=["qwen3", "phi3", "gemma2"])
def served(request, tmp_path_factory):
    """(family, server, its folder's tokenizer, transformers' model of the folder)."""
    tmp = tmp_path_factory.mktemp(f"serve-{request.param}")
    folder = save_family(request.param, tmp / "model")
    tok = save_tokenizer(folder)
    port = free_port()
    env = serve_env(tmp, folder)
    server = start(["serve", "--dev", "--port", str(port)], env, str(tmp / "log"), port=port)
    try:
        yield request.param, wait_ready(server, timeout_s=240), tok, load_hf(folder)
    finally:
        server.stop()


def _reference(hf, ids: list[int]) -> list[int]:
    """transformers' greedy reply to `ids`, stopping at EOS as the server does (EOS kept)."""
    return hf_greedy(hf, [ids], [MAX_TOKENS], eos=True)[0]


def test_greedy_chat_and_completion_equal_transformers(served):
    family, server, tok, hf = served
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, logprobs=True
    )
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    want = _reference(hf, ids)
    assert chat.usage.prompt_tokens == len(ids), family
    got = [tok.convert_tokens_to_ids(t.token) for t in chat.choices[0].logprobs.content]
    assert got == want[: len(got)] and chat.usage.completion_tokens == len(want), family
    assert chat.choices[0].message.content == tok.decode(want, skip_special_tokens=True), family
    assert len(got) > 4, want  # a reply of several tokens, each one compared

    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    want = _reference(hf, tok(PROMPT)["input_ids"])
    assert completion.choices[0].text == tok.decode(want, skip_special_tokens=True), family
    assert completion.usage.completion_tokens == len(want), family


def _serve_refusal(tmp: Path, folder: Path) -> str:
    output = refused_serve(serve_env(tmp, folder))
    assert "Traceback" not in output
    assert not (tmp / "fairlane.db").exists()  # nothing started
    return output


@pytest.mark.parametrize(
    "change,named",
    [
        ({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"]}, "'qwen2_moe'"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quant_method 'gptq'"),
    ],
)
def test_serve_refuses_a_checkpoint_it_cannot_serve_at_start(tmp_path, change, named):
    folder = save_family("qwen3", tmp_path / "model")
    save_tokenizer(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    output = _serve_refusal(tmp_path, folder)
    assert f"cannot serve model {str(folder)!r}" in output and named in output, output


def test_a_folder_without_its_tokenizer_is_refused_at_start(tmp_path):
    folder = save_family("qwen3", tmp_path / "model")
    assert "tokenizer" in _serve_refusal(tmp_path, folder)
