"""Adapter admin REST over HTTP on SQLite and PostgreSQL: upload (PEFT files, validated against
the served model), list, get, delete; every bad upload is refused naming the problem and leaves
no file and no row; a tenant's own key manages only its own adapters; /v1/models and model
selection show a tenant its adapters only."""

from __future__ import annotations

from datetime import datetime

import pytest
from adapter_files import ALL, adapter_bytes, make_peft_adapter, multipart
from gateway_test_helpers import (
    ADMIN_TOKEN,
    TINY,
    TINY_ENGINE,
    admin_headers,
    assert_openai_error,
    make_tenant_key,
)
from sqlalchemy import func, select

from gateway.adapters.store import AdapterStore
from tenancy import Adapter, make_engine

MAX_RANK = 8


@pytest.fixture(scope="module")
def peft_files(tmp_path_factory):
    """PEFT adapters of the served (tiny) model, one of another model, and one over the rank limit."""
    root = tmp_path_factory.mktemp("peft")
    return {
        "qv": adapter_bytes(make_peft_adapter(root / "qv", TINY, r=4, targets=("q_proj", "v_proj"), seed=1)),
        "all": adapter_bytes(make_peft_adapter(root / "all", TINY, r=8, targets=ALL, seed=2)),
        "other-base": adapter_bytes(
            make_peft_adapter(root / "other", {**TINY, "hidden_size": 32, "head_dim": 8}, r=4, seed=3)
        ),
        "rank-16": adapter_bytes(make_peft_adapter(root / "r16", TINY, r=16, seed=4)),
    }


@pytest.fixture
def database_url(sql_database_url):
    return sql_database_url


@pytest.fixture
def settings(redis_url, database_url, model_name, tmp_path):
    from gateway.settings import ApiSettings

    return ApiSettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_url,
        database_url=database_url,
        engine={**TINY_ENGINE, "max_lora_rank": MAX_RANK},
        served_model_name=model_name,
        max_tokens_default=8,
        request_timeout_s=30,
        quota_key_prefix=f"fairlane:quota:{model_name}",
        adapter_dir=str(tmp_path / "adapters"),
        max_adapter_bytes=200_000,
    )


def _rows(database_url: str) -> int:
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.execute(select(func.count()).select_from(Adapter)).scalar()
    finally:
        engine.dispose()


async def _upload(client, tenant_id, name, config, weights, headers=None):
    return await client.post(
        f"/admin/tenants/{tenant_id}/adapters",
        headers=headers or admin_headers(),
        **multipart(name, config, weights),
    )


async def test_upload_list_get_delete(app_client, settings, peft_files):
    tenant, _key = await make_tenant_key(app_client, "acme")
    store = AdapterStore(settings.adapter_store_dir)
    config, weights = peft_files["all"]
    created = await _upload(app_client, tenant["id"], "support-bot", config, weights)
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["name"], body["tenant_id"], body["rank"], body["alpha"]) == (
        "support-bot",
        tenant["id"],
        8,
        8.0,
    )
    assert body["target_modules"] == list(ALL)
    assert body["size_bytes"] == len(config) + len(weights)
    assert datetime.fromisoformat(body["created_at"]).tzinfo is not None
    assert store.digests() == [body["sha256"]]
    folder = store.path(body["sha256"])
    assert (folder / "adapter_config.json").read_bytes() == config
    assert (folder / "adapter_model.safetensors").read_bytes() == weights

    listed = (await app_client.get(f"/admin/tenants/{tenant['id']}/adapters", headers=admin_headers())).json()
    assert listed["count"] == 1 and listed["data"][0] == body
    assert (await app_client.get(f"/admin/adapters/{body['id']}", headers=admin_headers())).json() == body

    deleted = await app_client.delete(f"/admin/adapters/{body['id']}", headers=admin_headers())
    assert deleted.status_code == 200 and deleted.json()["id"] == body["id"]
    assert store.digests() == [] and _rows(settings.database_url) == 0
    assert_openai_error(await app_client.get(f"/admin/adapters/{body['id']}", headers=admin_headers()), 404)
    assert_openai_error(
        await app_client.delete(f"/admin/adapters/{body['id']}", headers=admin_headers()), 404
    )
    assert_openai_error(await _upload(app_client, 999_999, "x", config, weights), 404, param="tenant_id")


async def test_the_same_files_are_stored_once_and_kept_while_a_row_uses_them(
    app_client, settings, peft_files
):
    acme, _ = await make_tenant_key(app_client, "acme")
    other, _ = await make_tenant_key(app_client, "other")
    store = AdapterStore(settings.adapter_store_dir)
    a = (await _upload(app_client, acme["id"], "bot", *peft_files["qv"])).json()
    b = (await _upload(app_client, other["id"], "bot", *peft_files["qv"])).json()
    assert a["sha256"] == b["sha256"] and store.digests() == [a["sha256"]]
    await app_client.delete(f"/admin/adapters/{a['id']}", headers=admin_headers())
    assert store.exists(b["sha256"])
    await app_client.delete(f"/admin/adapters/{b['id']}", headers=admin_headers())
    assert store.digests() == []


def _truncated(weights: bytes) -> bytes:
    return weights[: len(weights) - 100]


BAD_UPLOADS = [  # (case, name, config, weights, status, param, code); None: the part is left out
    ("wrong base shapes", "other-base", None, None, 400, "adapter_model", "adapter_base_mismatch"),
    ("rank over the limit", "rank-16", None, None, 400, "adapter_config", "adapter_rank_too_large"),
    ("truncated safetensors", "qv", None, _truncated, 400, "adapter_model", "invalid_adapter_weights"),
    ("not safetensors", "qv", None, lambda w: b"\x00" * 64, 400, "adapter_model", "invalid_adapter_weights"),
    ("missing config", "qv", "missing", None, 400, "adapter_config", "missing_adapter_file"),
    ("missing weights", "qv", None, "missing", 400, "adapter_model", "missing_adapter_file"),
    ("config not JSON", "qv", lambda c: b"{r: 4", None, 400, "adapter_config", "invalid_adapter_config"),
    (
        "unsupported module",
        "qv",
        lambda c: c.replace(b'"q_proj"', b'"lm_head"'),
        None,
        400,
        "adapter_config",
        "unsupported_target_module",
    ),
    (
        "DoRA",
        "qv",
        lambda c: c.replace(b'"use_dora": false', b'"use_dora": true'),
        None,
        400,
        "adapter_config",
        "unsupported_adapter",
    ),
    (
        "weights over max_adapter_bytes",
        "qv",
        None,
        lambda w: w + b"\x00" * 200_000,
        413,
        "adapter_model",
        "adapter_too_large",
    ),
]


@pytest.mark.parametrize("case", BAD_UPLOADS, ids=[c[0] for c in BAD_UPLOADS])
async def test_a_bad_upload_is_refused_and_leaves_no_file_and_no_row(app_client, settings, peft_files, case):
    _name, files, fix_config, fix_weights, status, param, code = case
    tenant, _ = await make_tenant_key(app_client, "acme")
    config, weights = peft_files[files]
    config = None if fix_config == "missing" else fix_config(config) if fix_config else config
    weights = None if fix_weights == "missing" else fix_weights(weights) if fix_weights else weights
    error = assert_openai_error(
        await _upload(app_client, tenant["id"], "bot", config, weights), status, param=param, code=code
    )
    assert "pydantic" not in error["message"]
    assert AdapterStore(settings.adapter_store_dir).digests() == [] and _rows(settings.database_url) == 0
    leftovers = list(settings.adapter_store_dir.iterdir()) if settings.adapter_store_dir.exists() else []
    assert leftovers == []  # no temporary upload folder either


async def test_a_duplicate_name_or_a_bad_name_is_refused_and_stores_nothing_more(
    app_client, settings, peft_files
):
    tenant, _ = await make_tenant_key(app_client, "acme")
    first = (await _upload(app_client, tenant["id"], "bot", *peft_files["qv"])).json()
    assert_openai_error(await _upload(app_client, tenant["id"], "bot", *peft_files["all"]), 409, param="name")
    for bad in ("", "a:b", "white space", "x" * 65):
        assert_openai_error(
            await _upload(app_client, tenant["id"], bad, *peft_files["all"]), 400, param="name"
        )
    assert_openai_error(await _upload(app_client, tenant["id"], None, *peft_files["all"]), 400, param="name")
    assert AdapterStore(settings.adapter_store_dir).digests() == [first["sha256"]]
    assert _rows(settings.database_url) == 1
    not_multipart = await app_client.post(
        f"/admin/tenants/{tenant['id']}/adapters", headers=admin_headers(), json={"name": "bot2"}
    )
    assert_openai_error(not_multipart, 400)


async def test_a_tenant_key_manages_only_its_own_adapters(app_client, settings, peft_files):
    acme, acme_key = await make_tenant_key(app_client, "acme")
    other, _ = await make_tenant_key(app_client, "other")
    scoped = await app_client.post(
        f"/admin/tenants/{other['id']}/keys",
        headers=admin_headers(),
        json={"name": "ops", "scopes": ["inference", "adapters"]},
    )
    other_key = {"Authorization": f"Bearer {scoped.json()['key']}"}
    mine = await _upload(app_client, other["id"], "mine", *peft_files["qv"], headers=other_key)
    assert mine.status_code == 201, mine.text
    theirs = (await _upload(app_client, acme["id"], "secret", *peft_files["all"])).json()
    listed = await app_client.get(f"/admin/tenants/{other['id']}/adapters", headers=other_key)
    assert [a["name"] for a in listed.json()["data"]] == ["mine"]
    # acme and its adapter do not exist for other's key: the same 404 as for what never existed
    missing_id = theirs["id"] + mine.json()["id"] + 1000
    for present, absent in (
        (f"/admin/adapters/{theirs['id']}", f"/admin/adapters/{missing_id}"),
        (f"/admin/tenants/{acme['id']}/adapters", "/admin/tenants/999999/adapters"),
    ):
        got = assert_openai_error(await app_client.get(present, headers=other_key), 404)
        want = assert_openai_error(await app_client.get(absent, headers=admin_headers()), 404)
        assert (got["code"], got["param"]) == (want["code"], want["param"])
    assert_openai_error(await app_client.delete(f"/admin/adapters/{theirs['id']}", headers=other_key), 404)
    assert_openai_error(await _upload(app_client, acme["id"], "x", *peft_files["qv"], headers=other_key), 404)
    assert (
        await app_client.get(f"/admin/adapters/{theirs['id']}", headers=admin_headers())
    ).status_code == 200
    # a key without the scope may not manage adapters at all; no credentials at all is a 401
    plain = {"Authorization": f"Bearer {acme_key}"}
    assert_openai_error(
        await app_client.get(f"/admin/tenants/{acme['id']}/adapters", headers=plain),
        403,
        code="missing_scope",
    )
    assert_openai_error(await app_client.get(f"/admin/adapters/{theirs['id']}"), 401)


async def test_models_lists_the_callers_adapters_only_and_others_are_not_found(
    app_client, settings, peft_files
):
    acme, acme_key = await make_tenant_key(app_client, "acme")
    other, other_key = await make_tenant_key(app_client, "other")
    await _upload(app_client, acme["id"], "support-bot", *peft_files["qv"])
    base = settings.model_name
    acme_h, other_h = ({"Authorization": f"Bearer {k}"} for k in (acme_key, other_key))
    acme_models = (await app_client.get("/v1/models", headers=acme_h)).json()["data"]
    assert [m["id"] for m in acme_models] == [base, f"{base}:support-bot"]
    assert acme_models[1]["parent"] == base and acme_models[1]["owned_by"] == "acme"
    assert [m["id"] for m in (await app_client.get("/v1/models", headers=other_h)).json()["data"]] == [base]
    assert (await app_client.get(f"/v1/models/{base}:support-bot", headers=acme_h)).status_code == 200
    got = assert_openai_error(
        await app_client.get(f"/v1/models/{base}:support-bot", headers=other_h), 404, code="model_not_found"
    )
    want = assert_openai_error(
        await app_client.get(f"/v1/models/{base}:no-such-bot", headers=other_h), 404, code="model_not_found"
    )
    assert got["message"].replace("support-bot", "?") == want["message"].replace("no-such-bot", "?")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for model in (f"{base}:support-bot", f"{base}:", f"{base}:no-such-bot", "other-model:support-bot"):
        response = await app_client.post(
            "/v1/chat/completions", headers=other_h, json={"model": model, **chat}
        )
        assert_openai_error(response, 404, param="model", code="model_not_found")
        response = await app_client.post(
            "/v1/completions", headers=other_h, json={"model": model, "prompt": "hi", "max_tokens": 2}
        )
        assert_openai_error(response, 404, param="model", code="model_not_found")
