"""The console in a real browser (Debian's chromium, headless, driven by Playwright) against one
`fairlane serve` with a real worker: sign in with the admin token, create a tenant, a key (its
secret shown once, then used with the openai client) and a quota, send traffic and see it in the
usage charts and the live view, upload and delete an adapter, revoke the key and see the client
refused; a tenant key opens nothing; the browser logs no error. The tests run in order and share
one server and one browser. With FAIRLANE_TEST_CONSOLE_SCREENSHOTS=<folder> each page is saved there
(docs/console/*.png are made this way)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from adapter_files import make_peft_adapter
from serve_process import free_port, start, wait_ready

from benchmarks.common import TINY_DUMMY_SHAPE

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (.ci/setup)")
CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} is not installed (.ci/setup installs Debian's chromium)", allow_module_level=True
    )

ADMIN_TOKEN = "console-admin-token-0123456789abcdef"
MODEL = "dummy"
DUMMY = {**TINY_DUMMY_SHAPE, "max_position_embeddings": 4096}
SHOTS = os.environ.get("FAIRLANE_TEST_CONSOLE_SCREENSHOTS")
PAGES = ("tenants", "tenant", "keys", "quotas", "adapters", "usage", "live", "login")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    port = free_port()
    env = {
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_REDIS_URL": "",  # the embedded server
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
        "FAIRLANE_ADMIN_TOKEN": ADMIN_TOKEN,
        "FAIRLANE_ADAPTER_DIR": str(tmp / "adapters"),
        "FAIRLANE_ENGINE__MODEL": MODEL,
        "FAIRLANE_ENGINE__DUMMY_CONFIG": json.dumps(DUMMY),
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "512",
    }
    served = start(["serve", "--port", str(port)], env, str(tmp / "serve.log"), port=port)
    served.extra["tmp"] = tmp
    try:
        yield wait_ready(served, timeout_s=240)
    finally:
        served.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shared():
    return {}


@pytest.fixture(scope="module")
def page(browser, server, shared):
    context = browser.new_context(base_url=server.base_url, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    shared["problems"] = problems = []
    page.on(
        "console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: d.accept())  # hx-confirm on revoke and delete
    yield page
    context.close()


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def submit(page, form: str) -> None:
    """Submit a form (boosted by htmx) and wait for the swap to settle."""
    with page.expect_response(lambda r: r.request.method == "POST"):
        page.locator(f"{form} button[type=submit]").click()
    page.wait_for_load_state()


def test_sign_in_with_the_admin_token_sets_a_strict_http_only_cookie(page, server):
    page.goto("/console/tenants")
    assert page.url.endswith("/console/login")
    shot(page, "login")
    page.fill("input[name=token]", ADMIN_TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/tenants")
    cookie = next(c for c in page.context.cookies() if c["name"] == "fairlane_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    assert page.evaluate("document.cookie") == ""  # out of reach of scripts


def test_create_and_edit_a_tenant(page, shared):
    page.fill("#create-tenant input[name=name]", "acme")
    page.fill("#create-tenant input[name=weight]", "2")
    submit(page, "#create-tenant")
    row = page.locator("tr[data-tenant=acme]")
    assert "2.0" in row.inner_text() and "active" in row.inner_text()
    row.locator("a", has_text="acme").click()
    page.wait_for_url("**/console/tenants/*")
    shared["tenant_id"] = int(page.url.rsplit("/", 1)[1])
    page.fill("#edit-tenant input[name=weight]", "3")
    page.fill("#edit-tenant input[name=share_batch]", "0.5")
    page.fill("#edit-tenant input[name=ttft_target_s]", "2.5")
    submit(page, "#edit-tenant")
    assert page.locator(".notice").inner_text() == "Saved."
    assert page.input_value("#edit-tenant input[name=share_batch]") == "0.5"
    shot(page, "tenant")
    page.goto("/console/tenants")
    row = page.locator("tr[data-tenant=acme]").inner_text()
    assert "3.0" in row and "batch 0.5" in row and "2.5 s" in row
    shot(page, "tenants")


def test_create_a_key_whose_secret_is_shown_once(page, server, shared):
    page.goto(f"/console/tenants/{shared['tenant_id']}/keys")
    page.fill("#create-key input[name=name]", "ci")
    submit(page, "#create-key")
    secret = page.locator("#secret-value").inner_text().strip()
    assert secret.startswith("fl-")
    shared["key"] = secret
    shared["prefix"] = secret.split("_")[0]
    shot(page, "keys")
    page.reload()
    assert page.locator("#new-secret").count() == 0 and secret not in page.content()
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=secret, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert reply.usage.completion_tokens > 0
    shared["client"] = client


def test_set_a_quota_and_see_usage_beside_it(page, shared):
    page.goto(f"/console/tenants/{shared['tenant_id']}/quotas")
    page.fill("#quota-form input[name=requests_per_minute]", "6")
    page.fill("#quota-form input[name=daily_token_budget]", "1000000")
    submit(page, "#quota-form")
    assert "Quota saved" in page.locator(".notice").inner_text()
    assert page.input_value("#quota-form input[name=requests_per_minute]") == "6"


def _long_stream(client, done: threading.Event) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=3000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _chunk in stream:
        pass
    done.set()


def test_traffic_shows_in_the_live_view_and_the_quota(page, shared):
    client = shared["client"]
    done = threading.Event()
    streamer = threading.Thread(target=_long_stream, args=(client, done), daemon=True)
    streamer.start()
    page.goto("/console/live")
    row = page.locator("#live-tenants tr[data-tenant=acme]")
    row.wait_for(timeout=20_000)  # the next heartbeat of the worker, the next refresh of the panel
    assert int(row.locator(".running").inner_text()) >= 1
    assert int(page.locator("#workers-count").inner_text()) == 1
    assert int(page.locator("#kv-used").inner_text()) > 0
    shot(page, "live")
    sent = 2  # the first request and the stream
    while True:  # 6 a minute (refilled one every 10 s): a burst soon meets a 429
        try:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        except openai.RateLimitError:
            break
        sent += 1
        assert sent < 30, "no request was refused"
    shared["sent"] = sent
    page.goto(f"/console/tenants/{shared['tenant_id']}/quotas")
    assert "6 used of 6 this minute" in page.locator("tr[data-limit=requests_per_minute]").inner_text()
    assert "used" in page.locator("tr[data-limit=daily_token_budget]").inner_text()
    shot(page, "quotas")
    assert done.wait(120), "the long stream did not finish"


def test_usage_charts_and_csv_read_the_rollups(page, shared):
    deadline = time.monotonic() + 30
    while True:  # usage and 429s reach the roll-ups within the gateway's flush period (5 s);
        # the long stream ends last, so its record can land a flush after the 429's
        page.goto("/console/usage?days=1")
        page.wait_for_function("window.fairlaneCharts && window.fairlaneCharts.tokens")
        charts = page.evaluate(
            """() => Object.fromEntries(Object.entries(window.fairlaneCharts).map(([k, c]) =>
                 [k, c.data.datasets.map(d => [d.label, d.data.reduce((a, b) => a + b, 0)])]))"""
        )
        problems = dict(charts["problems"])
        settled = dict(charts["requests"]).get("acme", 0) >= shared["sent"]
        if (problems["429s (quota)"] >= 1 and settled) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert problems["429s (quota)"] == 1
    assert dict(charts["requests"])["acme"] == shared["sent"] and dict(charts["tokens"])["acme"] > 3000
    assert "acme" in page.locator("#usage-totals tr[data-owner=acme]").inner_text()
    shot(page, "usage")
    csv = page.request.get("/console/usage.csv?days=1")
    assert csv.ok and csv.headers["content-type"].startswith("text/csv")
    lines = csv.text().strip().splitlines()
    assert lines[0].startswith("start,tenant_id,key_id,requests")
    assert any(line.split(",")[1] == str(shared["tenant_id"]) for line in lines[1:])


def test_upload_an_adapter_see_where_it_is_loaded_and_delete_it(page, server, shared, tmp_path):
    folder = make_peft_adapter(tmp_path / "adapter", DUMMY, r=4)
    page.goto(f"/console/adapters?tenant_id={shared['tenant_id']}")
    page.fill("#upload-adapter input[name=name]", "tone")
    page.set_input_files("#upload-adapter input[name=adapter_config]", str(folder / "adapter_config.json"))
    page.set_input_files(
        "#upload-adapter input[name=adapter_model]", str(folder / "adapter_model.safetensors")
    )
    submit(page, "#upload-adapter")
    assert "uploaded" in page.locator(".notice").inner_text(), page.content()
    assert page.locator("tr[data-adapter=tone]").count() == 1, page.content()
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}  # lift the quota spent by the last test
    httpx.put(f"{server.base_url}/admin/tenants/{shared['tenant_id']}/quota", json={}, headers=headers)
    reply = shared["client"].chat.completions.create(
        model=f"{MODEL}:tone", messages=[{"role": "user", "content": "a"}], max_tokens=2
    )
    assert reply.model == f"{MODEL}:tone"
    loaded = page.locator("tr[data-adapter=tone] .loaded")
    deadline = time.monotonic() + 10
    while loaded.inner_text() == "no worker":  # until the worker's next heartbeat names it
        assert time.monotonic() < deadline, "the adapter never showed as loaded"
        time.sleep(0.5)
        page.goto(f"/console/adapters?tenant_id={shared['tenant_id']}")
    shot(page, "adapters")
    page.locator("tr[data-adapter=tone] button").click()
    page.locator(".notice", has_text="deleted").wait_for()
    assert page.locator("tr[data-adapter=tone]").count() == 0


def test_revoking_the_key_refuses_the_client(page, shared):
    page.goto(f"/console/tenants/{shared['tenant_id']}/keys")
    page.locator(f"tr[data-key='{shared['prefix']}'] button").click()
    page.locator(".notice", has_text="revoked").wait_for()
    assert "revoked" in page.locator(f"tr[data-key='{shared['prefix']}']").inner_text()
    deadline = time.monotonic() + 5
    while True:
        try:
            shared["client"].models.list()
        except openai.AuthenticationError:
            break
        assert time.monotonic() < deadline, "the revoked key still works"
        time.sleep(0.2)


def test_a_tenant_key_opens_no_console_page_or_action(server, shared):
    admin = httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    key = admin.post(f"/admin/tenants/{shared['tenant_id']}/keys", json={"name": "other"}).json()["key"]
    tid = shared["tenant_id"]
    pages = ["tenants", f"tenants/{tid}", f"tenants/{tid}/keys", f"tenants/{tid}/quotas", "adapters"]
    pages += ["usage", "usage.csv", "live", "live/panel"]
    actions = ["tenants", f"tenants/{tid}", f"tenants/{tid}/status", f"tenants/{tid}/keys", "keys/1/revoke"]
    actions += [f"tenants/{tid}/quotas", f"tenants/{tid}/adapters", "adapters/1/delete", "logout"]
    for as_bearer in (True, False):
        options = {"headers": {"authorization": f"Bearer {key}"}} if as_bearer else {}
        client = httpx.Client(base_url=server.base_url + "/console", **options)
        if not as_bearer:
            client.cookies.set("fairlane_console", key, path="/console")
        for path in pages:
            response = client.get(f"/{path}")
            assert response.status_code == 303 and response.headers["location"] == "/console/login", path
        for path in actions:
            response = client.post(f"/{path}", data={"name": "evil"}, headers={"x-csrf-token": "x"})
            assert response.status_code == 401, path
        assert client.post("/login", data={"token": key}).status_code == 401
    assert [t["name"] for t in admin.get("/admin/tenants").json()["data"]] == ["acme"]


def test_the_browser_logged_no_error(page, shared):
    page.goto("/console/tenants")
    page.wait_for_timeout(300)
    assert shared["problems"] == []


def test_sign_out_goes_to_the_sign_in_page_where_a_wrong_token_is_told(page):
    # found by an exploratory run: htmx swapped the sign-in form into the page it was on (its URL
    # kept), and a wrong token there showed nothing (htmx swaps no 401)
    page.goto("/console/tenants")
    page.locator("form.logout button").click()
    page.wait_for_url("**/console/login")
    assert not [c for c in page.context.cookies() if c["name"] == "fairlane_console"]
    page.fill("input[name=token]", "not-the-admin-token")
    page.click("button[type=submit]")
    page.locator(".error", has_text="not this gateway's admin token").wait_for()
    assert page.url.endswith("/console/login")
    page.fill("input[name=token]", ADMIN_TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/tenants")


def test_a_refused_change_is_told_on_the_page(page, server):
    # found by an exploratory run: a sign-in in a second tab replaces the session, and the first
    # tab's next change was refused (403, CSRF) with nothing shown: htmx swaps no 4xx
    second = page.context.new_page()
    second.goto(server.base_url + "/console/login")
    second.fill("input[name=token]", ADMIN_TOKEN)
    second.click("button[type=submit]")
    second.wait_for_url("**/console/tenants")
    second.close()
    page.fill("#create-tenant input[name=name]", "stale-tab")
    submit(page, "#create-tenant")
    page.locator("#request-error", has_text="reload the page").wait_for()
    page.reload()
    page.fill("#create-tenant input[name=name]", "stale-tab")
    submit(page, "#create-tenant")
    page.locator(".notice", has_text="'stale-tab' created").wait_for()
    assert page.locator("#request-error").count() == 0
