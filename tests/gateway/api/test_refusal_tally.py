"""Quota refusals reach the hourly usage roll-ups in one batched write."""

from __future__ import annotations

from sqlalchemy import select

from gateway.api.refusal_tally import RefusalTally
from tenancy import UsageHourly, create_api_key, create_tenant, make_engine, make_session_factory


async def test_refusals_are_counted_and_flushed_in_one_write(database_url):
    engine = make_engine(database_url)
    factory = make_session_factory(engine)
    with factory() as session:
        tenant = create_tenant(session, name="noisy")
        key = create_api_key(session, tenant_id=tenant.id).api_key
    tally = RefusalTally(factory, flush_every_s=0.05)
    for _ in range(5):
        tally.note(tenant.id, key.id)
    tally.note(tenant.id, None)
    await tally.aclose()
    with factory() as session:
        rows = {r.key_id: r.rate_limited for r in session.scalars(select(UsageHourly))}
    engine.dispose()
    assert rows == {key.id: 5, 0: 1, -1: 6, -2: 6}  # -1, -2: the tenant's hour and day totals
    assert not tally.counts
