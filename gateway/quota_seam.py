"""The quotas seam: the one dependency in the request path that admits and settles requests.

Today it only checks the key's enabled flag. The quotas package plugs in here: ``admit`` may
reserve prompt + max_tokens and raise RateLimited (429) with OpenAI rate-limit headers, and
``settle`` refunds what the request did not use. Routes call admit once before queueing and settle
exactly once when the request ends, whatever the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from gateway.auth import AuthContext
from gateway.errors import PermissionDenied


@dataclass
class Admission:
    """A request that was let in: what it reserved, and the headers to send back with it."""

    auth: AuthContext
    request_id: str
    tier: str
    prompt_tokens: int
    max_tokens: int
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False


class QuotaSeam:
    """admit/settle for one gateway replica (stateless; limits live in Redis)."""

    async def admit(self, *, auth: AuthContext, request_id: str, tier: str, prompt_tokens: int,
                    max_tokens: int) -> Admission:
        if not auth.enabled:
            raise PermissionDenied("This API key is disabled.", code="key_disabled")
        return Admission(auth=auth, request_id=request_id, tier=tier, prompt_tokens=prompt_tokens,
                         max_tokens=max_tokens)

    async def settle(self, admission: Admission, *, completion_tokens: int, status: str) -> None:
        """Release what ``admit`` held; idempotent."""
        admission.settled = True


def get_quota_seam(request: Request) -> QuotaSeam:
    return request.app.state.gateway.quota_seam


QuotaDep = Annotated[QuotaSeam, Depends(get_quota_seam)]
