"""schemathesis over our own OpenAPI document (reliability must-show 2): cases generated from
`/openapi.json` for the /v1 operations (chat, completions, models) and every /admin operation,
sent to the app in process (schemathesis' ASGI transport, lifespan run) with a real tiny worker
behind it, real Redis and SQLite. No answer is a 5xx, and every answer conforms to the document:
a documented status, content type and body schema. Valid (positive) and invalid (negative)
inputs both; at least 500 cases in all."""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from gateway_test_helpers import ADMIN_TOKEN
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
CASES_PER_MODE = {"/v1": 40, "/admin": 16}  # most per operation and mode (fewer where hypothesis runs out)
MIN_CASES = 500


@pytest.fixture
def served_app(settings):
    """The app, its lifespan started by schemathesis' ASGI client (one event loop thread), and an
    API key made over the admin API; the lifespan is stopped after the test."""
    from gateway.api.app import create_app

    app = create_app(settings)
    with asgi.get_client(app) as client:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        tenant = client.post(
            "/admin/tenants",
            json={"name": "fuzz", "allowed_tiers": ["priority", "standard", "batch"]},
            headers=admin,
        )
        assert tenant.status_code == 201, tenant.text
        key = client.post(f"/admin/tenants/{tenant.json()['id']}/keys", json={"name": "k"}, headers=admin)
        assert key.status_code == 201, key.text
    yield app, key.json()["key"]
    asgi.shutdown_lifespans()


def _run(
    operation,
    headers: dict,
    mode: GenerationMode,
    examples: int,
    failures: dict,
    statuses: Counter,
    model: str,
) -> int:
    count = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis_settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )
    def run(case) -> None:
        nonlocal count
        count += 1
        if mode == GenerationMode.POSITIVE and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = model  # past the model check, on to quotas, the lane and the worker
        response = case.call(headers=headers)
        statuses[(operation.path, response.status_code)] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except (
            Exception,
            BaseExceptionGroup,
        ) as exc:  # collected: every distinct finding is reported at once
            found = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
            kinds = ", ".join(sorted({getattr(f, "title", type(f).__name__) for f in found}))
            failures.setdefault(
                f"{operation.label} [{mode.value}] -> {response.status_code}: {kinds}",
                f"{exc}\n{response.text[:300]}",
            )

    run()
    return count


def test_no_server_error_and_every_answer_in_our_spec(served_app, running_worker):
    app, key = served_app
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    headers = {
        "/v1": {"Authorization": f"Bearer {key}"},
        "/admin": {"Authorization": f"Bearer {ADMIN_TOKEN}"},
    }
    operations = [result.ok() for result in schema.get_all_operations()]
    operations = [op for op in operations if op.path.startswith(("/v1/", "/admin/"))]
    operations.sort(
        key=lambda op: not op.path.startswith("/v1/")
    )  # admin cases may revoke the key: /v1 first
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= {op.path for op in operations}
    failures: dict[str, str] = {}  # what went wrong -> its first example
    statuses: Counter = Counter()  # (path, status) -> cases
    total = 0
    for operation in operations:
        prefix = "/v1" if operation.path.startswith("/v1/") else "/admin"
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            total += _run(
                operation,
                headers[prefix],
                mode,
                CASES_PER_MODE[prefix],
                failures,
                statuses,
                app.state.gateway.settings.model_name,
            )
    assert not failures, (
        f"{len(failures)} distinct findings in {total} cases:\n"
        + "\n".join(failures)
        + "\n\n"
        + "\n\n".join(list(failures.values())[:10])
    )
    assert total >= MIN_CASES, total
    served = statuses[("/v1/chat/completions", 200)] + statuses[("/v1/completions", 200)]
    assert served > 0, statuses  # some generated requests went all the way: quotas, the lane, the worker
