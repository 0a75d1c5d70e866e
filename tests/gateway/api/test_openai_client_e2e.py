"""The official openai client (sync and async) against a live `fairlane serve --dev` with its real
worker and the real SmolLM2 model. Generations are short (8 tokens, greedy) to stay fast on CPU."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import redis as redislib
from serve_process import free_port, start, wait_ready
from sqlalchemy import select

from tenancy import UsageRecord, make_engine, make_session_factory

pytestmark = pytest.mark.real_model

MODEL = "smollm2"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
        "FAIRLANE_ENGINE__MODEL": MODEL,
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__MAX_NUM_SEQS": "8",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "128",
        "FAIRLANE_CONFIG": "",
    }
    env = {**env, "FAIRLANE_REDIS_URL": ""}  # empty: the embedded server
    served = start(["serve", "--dev", "--port", str(port)], env, str(tmp / "serve.log"), port=port)
    served.extra["database_url"] = env["FAIRLANE_DATABASE_URL"]
    try:
        yield wait_ready(served, timeout_s=240)
    finally:
        served.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def greedy_chat(client):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)


def test_dev_banner_and_models(server, client):
    assert server.api_key.startswith("fl-") and server.admin_token
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_non_streaming_has_text_and_usage(greedy_chat):
    assert greedy_chat.choices[0].message.role == "assistant"
    assert "paris" in greedy_chat.choices[0].message.content.lower()
    assert greedy_chat.choices[0].finish_reason in ("stop", "length")
    usage = greedy_chat.usage
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_streaming_matches_and_reports_usage(client, greedy_chat):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy_chat.choices[0].message.content
    assert (
        chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == greedy_chat.usage.completion_tokens
    )
    assert chunks[-1].usage.prompt_tokens == greedy_chat.usage.prompt_tokens


def test_completions_streamed_and_not(client):
    plain = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert plain.usage.completion_tokens == 6 and plain.choices[0].text
    stream = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens


def test_a_client_rendered_chat_template_as_completion_prompt_answers_as_the_chat(client, greedy_chat):
    # what lm-eval's --apply_chat_template with local-completions sends: the template's text
    from engine import assets

    tok = assets.load_tokenizer(MODEL)
    rendered = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    reply = client.completions.create(model=MODEL, prompt=rendered, max_tokens=8, temperature=0)
    assert reply.usage.prompt_tokens == greedy_chat.usage.prompt_tokens  # <|im_start|>: one token
    assert reply.choices[0].text == greedy_chat.choices[0].message.content


def test_client_exceptions_carry_our_messages(server, client):
    wrong = openai.OpenAI(base_url=server.base_url + "/v1", api_key="fl-wrongkey_" + "x" * 43, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="Incorrect API key"):
        wrong.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.PermissionDeniedError, match="may not use service_tier 'priority'") as excinfo:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, service_tier="priority")
    assert excinfo.value.code == "tier_not_allowed" and excinfo.value.param == "service_tier"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-9", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="response_format.type must be one of"):
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, response_format={"type": "xml"}
        )
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=10**6)


async def test_async_client_streams_and_raises(server, greedy_chat):
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == greedy_chat.choices[0].message.content
    completion = await client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0)
    assert completion.usage.completion_tokens == 4
    with pytest.raises(openai.PermissionDeniedError, match="priority"):
        await client.completions.create(
            model=MODEL, prompt="x", max_tokens=2, extra_body={"service_tier": "priority"}
        )
    await client.close()


def _blocks(redis_url: str) -> tuple[int, int]:
    """(free, total) KV blocks of the serving worker, as its heartbeat last reported them."""
    client = redislib.Redis.from_url(redis_url)
    (worker_id,) = client.zrange(f"workers:{MODEL}", 0, -1)
    info = client.hgetall(f"worker:{MODEL}:{worker_id.decode()}")
    client.close()
    return int(info[b"free_blocks"]), int(info[b"total_blocks"])


def test_client_disconnect_aborts_and_frees_blocks(server):
    redis_url = server.extra["redis_url"]
    deadline = time.monotonic() + 10
    while (blocks := _blocks(redis_url))[0] != blocks[1]:  # earlier tests' requests are released
        assert time.monotonic() < deadline, blocks
        time.sleep(0.1)
    idle_free = blocks[0]
    payload = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        with client.stream(
            "POST", "/v1/completions", json=payload, headers={"Authorization": f"Bearer {server.api_key}"}
        ) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for _ in range(6):  # a few tokens in: the request holds KV blocks
                next(line for line in lines if line.startswith("data: "))
            time.sleep(0.8)  # let a heartbeat report them
            assert _blocks(redis_url)[0] < idle_free
        # leaving the `with` closes the connection mid-stream (400 tokens take many seconds here)
    deadline = time.monotonic() + 5
    while _blocks(redis_url)[0] != idle_free:
        assert time.monotonic() < deadline, "the aborted request's blocks were not freed"
        time.sleep(0.1)
    assert _cancelled(server), "the aborted request was not recorded as cancelled"


def test_non_streaming_client_that_gives_up_is_aborted_too(server):
    redis_url = server.extra["redis_url"]
    deadline = time.monotonic() + 10
    while (blocks := _blocks(redis_url))[0] != blocks[1]:
        assert time.monotonic() < deadline, blocks
        time.sleep(0.1)
    before = len(_cancelled(server))
    payload = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client stops waiting and closes its connection
        httpx.post(
            server.base_url + "/v1/completions",
            json=payload,
            timeout=1.5,
            headers={"Authorization": f"Bearer {server.api_key}"},
        )
    deadline = time.monotonic() + 5
    while _blocks(redis_url)[0] != blocks[0]:
        assert time.monotonic() < deadline, "the abandoned request kept its blocks"
        time.sleep(0.1)
    deadline = time.monotonic() + 5
    while len(cancelled := _cancelled(server)) != before + 1:
        assert time.monotonic() < deadline, "no usage record for the abandoned request"
        time.sleep(0.1)
    assert all(n < 400 for n in cancelled)


def _cancelled(server) -> list[int]:
    """completion_tokens of every request recorded as cancelled."""
    engine = make_engine(server.extra["database_url"])
    with make_session_factory(engine)() as session:
        rows = session.scalars(
            select(UsageRecord.completion_tokens).where(UsageRecord.status == "cancelled")
        ).all()
    engine.dispose()
    return list(rows)
