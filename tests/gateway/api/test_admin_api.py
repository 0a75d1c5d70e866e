"""Admin REST over HTTP against a real database and Redis."""

from __future__ import annotations

from gateway_test_helpers import admin_headers, assert_openai_error, make_tenant_key


async def test_admin_needs_the_admin_token(app_client):
    assert_openai_error(await app_client.get("/admin/tenants"), 401, code="invalid_admin_token")
    bad = {"Authorization": "Bearer wrong-token-wrong-token"}
    assert_openai_error(await app_client.get("/admin/tenants", headers=bad), 401)
    assert (await app_client.get("/admin/tenants", headers=admin_headers())).status_code == 200


async def test_tenant_lifecycle(app_client):
    h = admin_headers()
    created = await app_client.post(
        "/admin/tenants",
        headers=h,
        json={
            "name": "acme",
            "weight": 2.5,
            "default_tier": "standard",
            "allowed_tiers": ["priority", "standard"],
        },
    )
    assert created.status_code == 201
    tenant = created.json()
    assert (tenant["name"], tenant["weight"], tenant["status"]) == ("acme", 2.5, "active")
    assert_openai_error(
        await app_client.post("/admin/tenants", headers=h, json={"name": "acme"}), 409, param="name"
    )
    listed = (await app_client.get("/admin/tenants", headers=h)).json()
    assert listed["count"] == 1 and listed["data"][0]["id"] == tenant["id"]
    updated = await app_client.patch(f"/admin/tenants/{tenant['id']}", headers=h, json={"weight": 1.0})
    assert updated.json()["weight"] == 1.0 and updated.json()["allowed_tiers"] == ["priority", "standard"]
    disabled = await app_client.post(f"/admin/tenants/{tenant['id']}/disable", headers=h)
    assert disabled.json()["status"] == "disabled"
    fetched = await app_client.get(f"/admin/tenants/{tenant['id']}", headers=h)
    assert fetched.json()["status"] == "disabled"
    assert_openai_error(await app_client.get("/admin/tenants/9999", headers=h), 404)


async def test_tenant_input_is_validated(app_client):
    h = admin_headers()
    assert_openai_error(
        await app_client.post("/admin/tenants", headers=h, json={"name": "x", "weight": -1}),
        422,
        param="weight",
    )
    assert_openai_error(
        await app_client.post("/admin/tenants", headers=h, json={"name": "bad name!"}), 422, param="name"
    )
    assert_openai_error(
        await app_client.post("/admin/tenants", headers=h, json={"name": "x", "allowed_tiers": ["gold"]}),
        422,
        param="allowed_tiers",
    )
    assert_openai_error(  # an unknown tier is named by the field it is in
        await app_client.post("/admin/tenants", headers=h, json={"name": "x", "default_tier": "gold"}),
        422,
        param="default_tier",
    )
    assert_openai_error(
        await app_client.post("/admin/tenants", headers=h, json={"name": "x", "default_tier": "priority"}),
        422,
        param="default_tier",
    )
    for weight in (True, "NaN", "2"):  # a number, not a boolean or a string
        refused = await app_client.post("/admin/tenants", headers=h, json={"name": "x", "weight": weight})
        assert_openai_error(refused, 422, param="weight")
    assert_openai_error(
        await app_client.post("/admin/tenants", headers=h, json={"name": "x", "ttft_target_s": True}),
        422,
        param="ttft_target_s",
    )
    assert_openai_error(
        await app_client.post("/admin/tenants", headers=h, json={"name": "x", "surprise": 1}),
        422,
        param="surprise",
    )


async def test_keys_secret_shown_once_and_revocation(app_client):
    h = admin_headers()
    tenant, key = await make_tenant_key(app_client, "acme")
    assert key.startswith("fl-")
    no_scope = await app_client.post(f"/admin/tenants/{tenant['id']}/keys", headers=h, json={"scopes": []})
    assert_openai_error(no_scope, 422, param="scopes")  # a key that may do nothing
    keys = (await app_client.get(f"/admin/tenants/{tenant['id']}/keys", headers=h)).json()
    assert keys["count"] == 1
    listed = keys["data"][0]
    assert "key" not in listed and key.startswith(listed["prefix"] + "_")
    assert key not in (await app_client.get(f"/admin/keys/{listed['id']}", headers=h)).text
    models = await app_client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 200
    revoked = await app_client.post(f"/admin/keys/{listed['id']}/revoke", headers=h)
    assert revoked.json()["revoked_at"] is not None
    assert_openai_error(await app_client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}), 401)
    active = (
        await app_client.get(f"/admin/tenants/{tenant['id']}/keys?include_revoked=false", headers=h)
    ).json()
    assert active["count"] == 0
    assert_openai_error(await app_client.post("/admin/tenants/999/keys", headers=h, json={}), 404)


async def test_usage_report_counts_served_requests(app_client, running_worker, settings):
    h = admin_headers()
    tenant, key = await make_tenant_key(app_client, "acme")
    for max_tokens in (3, 4):
        response = await app_client.post(
            "/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": settings.model_name,
                "prompt": "hello",
                "max_tokens": max_tokens,
                "ignore_eos": True,
            },
        )
        assert response.status_code == 200, response.text
    usage = (await app_client.get(f"/admin/tenants/{tenant['id']}/usage", headers=h)).json()
    assert usage["totals"]["requests"] == 2 and usage["totals"]["completion_tokens"] == 7
    assert usage["totals"]["prompt_tokens"] == 10  # "hello": 5 byte tokens, twice
    assert usage["by_tier"]["standard"]["requests"] == 2
    assert usage["by_model"][settings.model_name]["total_tokens"] == 17
    empty = (
        await app_client.get(
            f"/admin/tenants/{tenant['id']}/usage",
            params={"since": "2001-01-01T00:00:00Z", "until": "2001-02-01T00:00:00Z"},
            headers=h,
        )
    ).json()
    assert empty["totals"]["requests"] == 0
    assert_openai_error(
        await app_client.get(
            f"/admin/tenants/{tenant['id']}/usage",
            params={"since": "2030-01-01T00:00:00Z", "until": "2001-01-01T00:00:00Z"},
            headers=h,
        ),
        422,
    )


async def test_openapi_docs_are_served(app_client):
    assert (await app_client.get("/docs")).status_code == 200
    paths = (await app_client.get("/openapi.json")).json()["paths"]
    assert {"/v1/chat/completions", "/admin/tenants", "/admin/keys/{key_id}/revoke"} <= set(paths)


async def test_a_disabled_tenants_key_is_told_so(app_client):
    """A good key of a disabled tenant is a 401 that says so (OpenAI's account_deactivated), not the
    wrong-key message; a revoked key keeps the wrong-key one."""
    h = admin_headers()
    tenant, key = await make_tenant_key(app_client, "paused")
    other, revoked = await make_tenant_key(app_client, "other")
    models = {"Authorization": f"Bearer {key}"}
    assert (await app_client.get("/v1/models", headers=models)).status_code == 200
    await app_client.post(f"/admin/tenants/{tenant['id']}/disable", headers=h)
    refused = await app_client.get("/v1/models", headers=models)
    assert_openai_error(refused, 401, code="account_deactivated")
    assert "disabled" in refused.json()["error"]["message"]
    (other_key,) = (await app_client.get(f"/admin/tenants/{other['id']}/keys", headers=h)).json()["data"]
    await app_client.post(f"/admin/keys/{other_key['id']}/revoke", headers=h)
    assert_openai_error(
        await app_client.get("/v1/models", headers={"Authorization": f"Bearer {revoked}"}),
        401,
        code="invalid_api_key",
    )


async def _pages(app_client, path: str, limit: int) -> list[dict]:
    """Every page of a list, ``limit`` at a time, each ``after`` the last id of the one before."""
    rows, after = [], 0
    while True:
        response = await app_client.get(
            path, params={"limit": limit, "after": after}, headers=admin_headers()
        )
        page = response.json()
        assert response.status_code == 200 and page["count"] == len(page["data"]) <= limit, page
        rows += page["data"]
        if not page["has_more"]:
            return rows
        assert page["count"] == limit
        after = page["data"][-1]["id"]


async def test_lists_come_whole_or_a_page_at_a_time_by_id(app_client):
    h = admin_headers()
    tenant = None
    for name in ("paged-a", "paged-b", "paged-c"):
        tenant, _ = await make_tenant_key(app_client, name)
    for name in ("second", "third"):
        created = await app_client.post(f"/admin/tenants/{tenant['id']}/keys", json={"name": name}, headers=h)
        assert created.status_code == 201
    for path, at_least in (("/admin/tenants", 3), (f"/admin/tenants/{tenant['id']}/keys", 3)):
        whole = (await app_client.get(path, headers=h)).json()
        assert whole["has_more"] is False and whole["count"] == len(whole["data"]) >= at_least
        ids = [row["id"] for row in whole["data"]]
        assert ids == sorted(ids)
        for limit in (1, 2):
            assert [row["id"] for row in await _pages(app_client, path, limit)] == ids
        last = await app_client.get(path, params={"after": ids[-1]}, headers=h)
        assert last.json() == {"data": [], "count": 0, "has_more": False}
    adapters = await app_client.get(f"/admin/tenants/{tenant['id']}/adapters", params={"limit": 1}, headers=h)
    assert adapters.json() == {"data": [], "count": 0, "has_more": False}
    for params in ({"limit": 0}, {"limit": 1001}, {"after": -1}, {"limit": "x"}):
        assert_openai_error(await app_client.get("/admin/tenants", params=params, headers=h), 422)
