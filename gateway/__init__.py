"""fairlane's gateway: OpenAI-compatible and admin HTTP APIs, auth, priority lanes on Redis, the
engine worker bridge, settings and the ``fairlane`` CLI.

Public names are imported lazily (PEP 562) so that a gateway replica never loads the engine
(torch) and ``fairlane`` subcommands start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_app": "gateway.app",
    "Settings": "gateway.settings",
    "AuthContext": "gateway.auth",
    "KeyCache": "gateway.auth",
    "invalidate_auth": "gateway.auth",
    "GatewayError": "gateway.errors",
    "InvalidRequest": "gateway.errors",
    "AuthenticationFailed": "gateway.errors",
    "PermissionDenied": "gateway.errors",
    "NotFound": "gateway.errors",
    "Conflict": "gateway.errors",
    "PayloadTooLarge": "gateway.errors",
    "UnprocessableEntity": "gateway.errors",
    "RateLimited": "gateway.errors",
    "ServiceUnavailable": "gateway.errors",
    "GatewayTimeout": "gateway.errors",
    "SLOUnattainable": "gateway.errors",
    "SLOGate": "gateway.slo_gate",
    "WorkerLoad": "gateway.messages",
    "LaneClient": "gateway.lanes",
    "lane_key": "gateway.lanes",
    "out_key": "gateway.lanes",
    "cancel_key": "gateway.lanes",
    "LaneRequest": "gateway.messages",
    "LaneResult": "gateway.messages",
    "SamplingSpec": "gateway.messages",
    "MessageError": "gateway.messages",
    "Admission": "gateway.quota_seam",
    "QuotaSeam": "gateway.quota_seam",
    "QuotaDep": "gateway.quota_seam",
    "resolve_tier": "gateway.tiers",
    "Worker": "gateway.worker",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
