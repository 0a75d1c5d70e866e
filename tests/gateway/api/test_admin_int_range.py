"""Row 7 of the reliability probe on SQLite and PostgreSQL: an admin path id or a quota limit beyond
the database's INTEGER range is a 422 in the OpenAI error shape, never a driver overflow (a 500 on
PostgreSQL); the largest id in range is a well-formed miss."""

from __future__ import annotations

import pytest
from gateway_test_helpers import admin_headers, assert_openai_error

from gateway.api.schemas.admin import DB_BIGINT_MAX, DB_INT_MAX

LIMITS = {  # a quota limit -> the largest its column holds
    "max_concurrency": DB_INT_MAX,
    "max_tokens_per_request": DB_INT_MAX,
    "daily_token_budget": DB_BIGINT_MAX,
    "monthly_token_budget": DB_BIGINT_MAX,
}


@pytest.fixture
def database_url(sql_database_url):
    return sql_database_url


@pytest.mark.parametrize(
    "path, method",
    [
        ("/admin/tenants/{id}", "GET"),
        ("/admin/tenants/{id}", "PATCH"),
        ("/admin/tenants/{id}/disable", "POST"),
        ("/admin/tenants/{id}/keys", "GET"),
        ("/admin/tenants/{id}/keys", "POST"),
        ("/admin/keys/{id}", "GET"),
        ("/admin/keys/{id}/revoke", "POST"),
        ("/admin/tenants/{id}/quota", "GET"),
        ("/admin/tenants/{id}/quota/usage", "GET"),
        ("/admin/keys/{id}/quota", "GET"),
        ("/admin/tenants/{id}/usage", "GET"),
    ],
)
async def test_row7_admin_ids_beyond_the_database_range_are_422(app_client, path, method):
    for bad in (DB_INT_MAX + 1, 2**63, 10**30, 0, -1):
        response = await app_client.request(method, path.format(id=bad), headers=admin_headers(), json={})
        assert_openai_error(response, 422)
    response = await app_client.request(method, path.format(id=DB_INT_MAX), headers=admin_headers(), json={})
    assert response.status_code in (404, 422), response.text  # the largest id is a well-formed miss


async def test_row7_quota_limits_beyond_their_columns_are_422_and_the_largest_are_stored(app_client):
    response = await app_client.post("/admin/tenants", json={"name": "range"}, headers=admin_headers())
    assert response.status_code == 201, response.text
    url = f"/admin/tenants/{response.json()['id']}/quota"
    for name, largest in LIMITS.items():
        response = await app_client.put(url, json={name: largest + 1}, headers=admin_headers())
        assert_openai_error(response, 422)
        for not_an_integer in (True, "5", 5.0):  # strict: true was stored as a limit of 1
            response = await app_client.put(url, json={name: not_an_integer}, headers=admin_headers())
            assert_openai_error(response, 422, param=name)
    response = await app_client.put(url, json=LIMITS, headers=admin_headers())
    assert response.status_code == 200, response.text
    stored = (await app_client.get(url, headers=admin_headers())).json()
    assert {name: stored[name] for name in LIMITS} == LIMITS


async def test_a_tenant_usage_report_until_the_first_month_of_year_one_is_422(app_client):
    # found by an exploratory run: the default 'since' (30 days before 'until') overflowed: a 500
    response = await app_client.post("/admin/tenants", json={"name": "early"}, headers=admin_headers())
    url = f"/admin/tenants/{response.json()['id']}/usage"
    for until in ("0001-01-01T00:00:00", "0001-01-30T23:00:00+05:00"):
        response = await app_client.get(url, params={"until": until}, headers=admin_headers())
        assert_openai_error(response, 422, param="until")
    response = await app_client.get(url, params={"until": "0001-02-01T00:00:00"}, headers=admin_headers())
    assert response.status_code == 200 and response.json()["totals"]["requests"] == 0, response.text
