"""Multi-LoRA through a live `fairlane serve --dev` (its real worker, SmolLM2 in fp32; the first
test in bf16 too) with the official openai client: adapters made by PEFT 0.21 on SmolLM2 are
uploaded over the admin API and used at once; each tenant sees, uses and deletes only its own; two
tenants' adapters in flight together each give their tenant the offline engine's tokens for that
adapter; an adapter deleted while a request streams with it lets that request finish, and the next
one is a 404."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from adapter_files import ALL, adapter_bytes, make_peft_adapter, multipart
from serve_process import free_port, start, wait_ready

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(1800)]

MODEL = "smollm2"
MESSAGES = [{"role": "user", "content": "Name two colors."}]
N = 8  # greedy tokens per comparison
SAMPLING = {"max_tokens": N, "temperature": 0}
NO_EOS = {"ignore_eos": True}


# The engine's dtype, offline and in the server: every test runs in fp32, the first in bf16 too (the
# adapters' deltas are PEFT's arithmetic in every dtype: tests/engine/lora/test_lora_smollm2.py).
FP32_ONLY = pytest.mark.parametrize("dtype", ["float32"], indirect=True)


@pytest.fixture(scope="module")
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def offline(dtype):
    from engine import LLM

    return LLM(model=MODEL, dtype=dtype, num_threads=1, max_loras=4, max_lora_rank=16)


@pytest.fixture(scope="module")
def adapters(offline, tmp_path_factory):
    """Two PEFT adapters of SmolLM2 (different ranks and modules, random non-zero B)."""
    import torch
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("smollm2-peft")
    base = AutoModelForCausalLM.from_pretrained(offline.engine.model_path, dtype=torch.float32).eval()
    folders = {
        "support-bot": make_peft_adapter(
            root / "support-bot", {}, r=8, alpha=16, targets=ALL, seed=21, b_std=0.15, base=base
        ),
        "pirate-bot": make_peft_adapter(
            root / "pirate-bot",
            {},
            r=4,
            alpha=8,
            targets=("q_proj", "v_proj", "o_proj"),
            seed=22,
            b_std=0.1,
            base=base,
        ),
    }
    del base
    return folders


@pytest.fixture(scope="module")
def expected(offline, adapters):
    """The offline engine's greedy text for the chat prompt: the base model and each adapter."""
    from engine import SamplingParams

    loras = [None, *(str(p) for p in adapters.values())]
    outs = offline.generate(
        [MESSAGES] * len(loras), SamplingParams(max_tokens=N, temperature=0, ignore_eos=True), lora=loras
    )
    texts = dict(zip([None, *adapters], [o.text for o in outs]))
    assert len(set(texts.values())) == 3, texts  # visibly different outputs
    return texts


@pytest.fixture(scope="module")
def server(tmp_path_factory, offline, dtype):
    tmp = tmp_path_factory.mktemp("serve-lora")
    port = free_port()
    env = {
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
        "FAIRLANE_ENGINE__MODEL": MODEL,
        "FAIRLANE_ENGINE__DTYPE": dtype,
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__MAX_NUM_SEQS": "8",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "256",
        "FAIRLANE_ADAPTER_DIR": str(tmp / "adapters"),
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_REDIS_URL": "",
    }
    served = start(["serve", "--dev", "--port", str(port)], env, str(tmp / "serve.log"), port=port)
    served.extra["adapter_dir"] = tmp / "adapters"
    try:
        yield wait_ready(served, timeout_s=300)
    finally:
        served.stop()


@pytest.fixture(scope="module")
def admin(server):
    with httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_token}"}, timeout=60
    ) as client:
        yield client


@pytest.fixture(scope="module")
def tenants(admin):
    """Two tenants, each with a key that may also manage its adapters."""
    out = {}
    for name in ("tenant-a", "tenant-b"):
        tenant = admin.post("/admin/tenants", json={"name": name}).json()
        key = admin.post(
            f"/admin/tenants/{tenant['id']}/keys", json={"name": "k", "scopes": ["inference", "adapters"]}
        ).json()["key"]
        out[name] = {"id": tenant["id"], "key": key}
    return out


def _client(server, key) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0, timeout=300)


def _upload(admin, tenant_id, name, folder):
    response = admin.post(f"/admin/tenants/{tenant_id}/adapters", **multipart(name, *adapter_bytes(folder)))
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture(scope="module")
def uploaded(admin, tenants, adapters):
    """tenant-a's support-bot and tenant-b's pirate-bot, uploaded to the running server."""
    return {
        "support-bot": _upload(admin, tenants["tenant-a"]["id"], "support-bot", adapters["support-bot"]),
        "pirate-bot": _upload(admin, tenants["tenant-b"]["id"], "pirate-bot", adapters["pirate-bot"]),
    }


def _chat(client, model):
    return client.chat.completions.create(model=model, messages=MESSAGES, extra_body=NO_EOS, **SAMPLING)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"], indirect=True)
def test_an_uploaded_adapter_is_served_at_once(server, tenants, uploaded, expected):
    a = _client(server, tenants["tenant-a"]["key"])
    assert [m.id for m in a.models.list()] == [MODEL, f"{MODEL}:support-bot"]
    reply = _chat(a, f"{MODEL}:support-bot")
    assert reply.model == f"{MODEL}:support-bot"
    assert reply.choices[0].message.content == expected["support-bot"]
    assert _chat(a, MODEL).choices[0].message.content == expected[None]
    metrics = httpx.get(server.base_url + "/metrics").text
    loads = [
        line for line in metrics.splitlines() if line.startswith("fairlane_engine_lora_slot_loads_total")
    ]
    assert loads and float(loads[0].split()[-1]) >= 1


@FP32_ONLY
def test_another_tenant_cannot_see_use_or_delete_an_adapter(server, admin, tenants, uploaded):
    b = _client(server, tenants["tenant-b"]["key"])
    assert [m.id for m in b.models.list()] == [MODEL, f"{MODEL}:pirate-bot"]
    for model in (f"{MODEL}:support-bot", f"{MODEL}:never-uploaded"):
        with pytest.raises(openai.NotFoundError) as refused:
            _chat(b, model)
        assert refused.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            b.completions.create(model=model, prompt="Hello", max_tokens=2)
    b_admin = {"Authorization": f"Bearer {tenants['tenant-b']['key']}"}
    support = uploaded["support-bot"]
    for method, path in (
        ("GET", f"/admin/adapters/{support['id']}"),
        ("DELETE", f"/admin/adapters/{support['id']}"),
        ("GET", f"/admin/tenants/{tenants['tenant-a']['id']}/adapters"),
    ):
        assert httpx.request(method, server.base_url + path, headers=b_admin).status_code == 404
    assert admin.get(f"/admin/adapters/{support['id']}").status_code == 200  # still there


@FP32_ONLY
def test_two_tenants_adapters_in_flight_together_each_get_their_own(server, tenants, uploaded, expected):
    a, b = _client(server, tenants["tenant-a"]["key"]), _client(server, tenants["tenant-b"]["key"])
    jobs = [(a, "support-bot"), (b, "pirate-bot"), (a, "support-bot"), (b, "pirate-bot"), (a, None)]
    texts: list[str | None] = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(i, client, adapter):
        barrier.wait()
        texts[i] = (
            _chat(client, MODEL if adapter is None else f"{MODEL}:{adapter}").choices[0].message.content
        )

    threads = [threading.Thread(target=run, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert texts == [expected[adapter] for _client_, adapter in jobs]


@FP32_ONLY
def test_delete_while_a_request_streams_lets_it_finish_then_404(
    server, admin, tenants, adapters, uploaded, expected
):
    a = _client(server, tenants["tenant-a"]["key"])
    config, weights = adapter_bytes(adapters["support-bot"])  # support-bot's weights, files of their own:
    config = json.dumps(
        {**json.loads(config), "revision": "short-lived"}
    ).encode()  # deleting them removes them
    response = admin.post(
        f"/admin/tenants/{tenants['tenant-a']['id']}/adapters", **multipart("short-lived", config, weights)
    )
    assert response.status_code == 201, response.text
    temp = response.json()
    assert temp["sha256"] != uploaded["support-bot"]["sha256"]
    stream = a.chat.completions.create(
        model=f"{MODEL}:short-lived",
        messages=MESSAGES,
        max_tokens=48,
        temperature=0,
        stream=True,
        extra_body=NO_EOS,
        stream_options={"include_usage": True},
    )
    chunks = iter(stream)
    first = next(chunks)
    deleted = admin.delete(f"/admin/adapters/{temp['id']}")
    assert deleted.status_code == 200
    assert not (
        server.extra["adapter_dir"] / temp["sha256"]
    ).exists()  # its files are gone, the request goes on
    rest = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices)
    assert rest[-1].usage.completion_tokens == 48
    assert text.startswith(expected["support-bot"])  # the same adapter all the way through
    with pytest.raises(openai.NotFoundError):
        _chat(a, f"{MODEL}:short-lived")
    assert f"{MODEL}:short-lived" not in [m.id for m in a.models.list()]
    assert admin.get(f"/admin/adapters/{temp['id']}").status_code == 404
    assert _chat(a, f"{MODEL}:support-bot").choices[0].message.content == expected["support-bot"]
