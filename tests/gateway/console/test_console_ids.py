"""Console pages and changes named by ids out of every row's range, on SQLite and PostgreSQL: the
quota page's ``key_id`` (a query parameter, not bounded as path ids are) is treated as a key that
does not exist (back to the tenants list), never a database overflow (a 500)."""

from __future__ import annotations

import pytest
from gateway_test_helpers import ADMIN_TOKEN, admin_headers

from gateway.api.schemas.admin import DB_ID_MAX
from gateway.console.session import COOKIE, read_cookie

OUT_OF_RANGE = (DB_ID_MAX + 1, 2**63, 10**30, 0, -1)


@pytest.fixture
def database_url(sql_database_url):
    return sql_database_url


@pytest.fixture
async def console(app_client):
    response = await app_client.post("/console/login", data={"token": ADMIN_TOKEN})
    assert response.status_code == 303, response.text
    cookie = response.cookies[COOKIE]
    app_client.cookies.set(COOKIE, cookie, path="/console")
    app_client.headers["x-csrf-token"] = read_cookie(ADMIN_TOKEN, cookie).csrf
    return app_client


async def test_a_quota_page_of_a_key_id_out_of_range_goes_back_to_the_tenants(console):
    # found by an exploratory run: key_id=99999999999 was a 500 on PostgreSQL, 10**30 on both
    tenant = (await console.post("/admin/tenants", json={"name": "acme"}, headers=admin_headers())).json()
    url = f"/console/tenants/{tenant['id']}/quotas"
    for key_id in OUT_OF_RANGE:
        response = await console.get(url, params={"key_id": key_id})
        assert response.status_code == 303, (key_id, response.text)
        assert response.headers["location"] == "/console/tenants"
        response = await console.post(url, params={"key_id": key_id}, data={"requests_per_minute": "5"})
        assert response.status_code == 303, (key_id, response.text)
    response = await console.get(url, params={"key_id": DB_ID_MAX})  # in range, no such key
    assert response.status_code == 303
    quota = await console.get(f"/admin/tenants/{tenant['id']}/quota", headers=admin_headers())
    assert quota.status_code == 404 or quota.json()["requests_per_minute"] is None, quota.text
