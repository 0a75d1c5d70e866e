"""The two ways ``fairlane admin`` reaches a deployment, behind one interface: the admin REST API of a
running gateway (with the admin token), or the database itself (``--database-url``, through the same
tenancy services the REST handlers call). Both return plain dicts shaped as the REST API's bodies."""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime

import httpx

from gateway.api.routes.admin_usage import series, series_csv, usage_range
from gateway.api.schemas.admin import ApiKeyCreated, ApiKeyPublic, TenantPublic
from gateway.api.schemas.quotas import QuotaPublic, QuotaSet


class AdminError(Exception):
    """A refused operation; its message is printed and the command exits 1."""


class HttpBackend:
    def __init__(self, url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self.client = httpx.Client(
            base_url=url.rstrip("/"), headers={"authorization": f"Bearer {token}"}, timeout=timeout_s
        )

    def _call(self, method: str, path: str, **kwargs):
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AdminError(f"{self.client.base_url} did not answer: {exc}") from None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            raise AdminError(f"{response.status_code}: {message}")
        return response

    def tenants(self) -> list[dict]:
        return self._call("GET", "/admin/tenants").json()["data"]

    def create_tenant(self, **fields) -> dict:
        return self._call("POST", "/admin/tenants", json=fields).json()

    def update_tenant(self, tenant_id: int, **fields) -> dict:
        return self._call("PATCH", f"/admin/tenants/{tenant_id}", json=fields).json()

    def create_key(self, tenant_id: int, **fields) -> dict:
        return self._call("POST", f"/admin/tenants/{tenant_id}/keys", json=fields).json()

    def revoke_key(self, key_id: int) -> dict:
        return self._call("POST", f"/admin/keys/{key_id}/revoke").json()

    def set_quota(self, tenant_id: int, key_id: int | None, limits: dict) -> dict:
        path = f"/admin/tenants/{tenant_id}/quota" if key_id is None else f"/admin/keys/{key_id}/quota"
        return self._call("PUT", path, json=limits).json()

    def usage(self, *, tenant_id, key_id, since, until, bucket, csv: bool):
        params = {"since": since.isoformat(), "bucket": bucket, "format": "csv" if csv else "json"}
        params |= {"until": until.isoformat()} if until else {}
        params |= {k: v for k, v in (("tenant_id", tenant_id), ("key_id", key_id)) if v is not None}
        response = self._call("GET", "/admin/usage", params=params)
        return response.text if csv else response.json()["data"]


class DatabaseBackend:
    """Straight on the database. With ``redis_url`` (the gateways' Redis) revocations, tenant changes
    and quotas are pushed to every gateway at once, as the REST API does; without it gateways see a
    quota only when they load it (a scope they have not seen) and other changes within their key
    cache's max age (60 s: gateway/api/auth.py)."""

    def __init__(self, database_url: str, *, redis_url: str | None = None, quota_prefix: str = "") -> None:
        from tenancy import make_engine, make_session_factory

        self.engine = make_engine(database_url)
        self.sessions = make_session_factory(self.engine)
        self.redis_url, self.quota_prefix = redis_url, quota_prefix

    def _run(self, work):
        from tenancy import TenancyError

        try:
            with self.sessions() as session:
                return work(session)
        except TenancyError as exc:
            raise AdminError(exc.message) from None

    def _push(self, *, tenant_id: int | None = None, key_id: int | None = None, quota=None) -> None:
        if not self.redis_url:
            print(
                "note: no --redis-url: gateways see this within 60 s (their key cache's max age)",
                file=sys.stderr,
            )
            return

        async def push() -> None:
            from gateway.api.auth import invalidate_auth
            from gateway.api.quota_service import tenancy_budget_loader
            from gateway.lanes.connect import async_client
            from quotas import KeySpace, Limiter, QuotaLimits

            redis = async_client(self.redis_url)
            try:
                if quota is not None:  # as the admin API stores it: budgets' use of the day first
                    limiter = Limiter(
                        redis,
                        keys=KeySpace(self.quota_prefix) if self.quota_prefix else None,
                        budget_loader=tenancy_budget_loader(self.sessions),
                    )
                    key = None if key_id is None else str(key_id)
                    try:
                        await limiter.store_limits(str(tenant_id), QuotaLimits.from_row(quota), key)
                    finally:
                        await limiter.aclose()
                await invalidate_auth(redis)
            finally:
                await redis.aclose()

        asyncio.run(push())

    def tenants(self) -> list[dict]:
        from tenancy import list_tenants

        return self._run(
            lambda s: [TenantPublic.model_validate(t).model_dump(mode="json") for t in list_tenants(s)]
        )

    def create_tenant(self, **fields) -> dict:
        from tenancy import create_tenant

        return self._run(
            lambda s: TenantPublic.model_validate(create_tenant(s, **fields)).model_dump(mode="json")
        )

    def update_tenant(self, tenant_id: int, **fields) -> dict:
        from tenancy import update_tenant

        body = self._run(
            lambda s: TenantPublic.model_validate(update_tenant(s, tenant_id=tenant_id, **fields)).model_dump(
                mode="json"
            )
        )
        self._push()
        return body

    def create_key(self, tenant_id: int, **fields) -> dict:
        from tenancy import create_api_key

        def create(session):
            created = create_api_key(session, tenant_id=tenant_id, **fields)
            public = ApiKeyPublic.model_validate(created.api_key).model_dump()
            return ApiKeyCreated(**public, key=created.key).model_dump(mode="json")

        return self._run(create)

    def revoke_key(self, key_id: int) -> dict:
        from tenancy import revoke_api_key

        body = self._run(
            lambda s: ApiKeyPublic.model_validate(revoke_api_key(s, key_id=key_id)).model_dump(mode="json")
        )
        self._push()
        return body

    def set_quota(self, tenant_id: int, key_id: int | None, limits: dict) -> dict:
        from quotas import QuotaLimits
        from tenancy import set_quota

        body = QuotaSet(**limits).model_dump()
        try:
            QuotaLimits.from_row(body)
        except ValueError as exc:
            raise AdminError(f"Invalid quota: {exc}.") from None
        row = self._run(
            lambda s: QuotaPublic.model_validate(set_quota(s, tenant_id=tenant_id, key_id=key_id, **body))
        )
        self._push(tenant_id=tenant_id, key_id=key_id, quota=body)
        return row.model_dump(mode="json")

    def usage(self, *, tenant_id, key_id, since: datetime, until: datetime | None, bucket: str, csv: bool):
        try:
            since, until = usage_range(since, until, bucket=bucket)
        except Exception as exc:
            raise AdminError(getattr(exc, "message", str(exc))) from None
        scope = dict(since=since, until=until, tenant_id=tenant_id, key_id=key_id, bucket=bucket)
        if csv:
            return self._run(lambda s: series_csv(s, **scope))
        rows, _by = self._run(lambda s: series(s, **scope))
        return [r | {"start": r["start"].isoformat()} for r in rows]
