"""The console's database queries on 1,000,000 usage records (PostgreSQL): p50 and p99 of each
against the 50 ms budget, every chart read from the hourly roll-ups.

    python -m benchmarks.console_queries            # 1,000,000 records, 100 tenants x 5 keys, 30 days
    python -m benchmarks.console_queries --smoke    # 20,000 records (SQLite if no PostgreSQL answers)

A fresh database is created on the server of --database-url (default $FAIRLANE_TEST_POSTGRES_URL,
else postgresql+psycopg://postgres@127.0.0.1:5432/test) and dropped after. It is migrated to 0003,
the records are bulk-inserted in one INSERT ... SELECT over generate_series, and the migration to
head rolls them up (timed: what an existing deployment pays once). Then each query the console
runs (the same tenancy functions, the same arguments as its pages) is timed --repeats times, and
the write path (``record_usage``: the record and its two roll-up rows in one transaction) too.

Writes console_queries.json and console_queries.png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from benchmarks.common import add_common_args, done, machine, out_dir
from gateway.api.routes.admin_usage import series_csv
from gateway.telemetry import gc_policy
from tenancy import (
    UsageHourly,
    UsageRecord,
    hour_of,
    list_api_keys,
    list_tenants,
    make_engine,
    make_session_factory,
    record_usage,
    tenant_quotas,
    upgrade,
    usage_series,
    usage_totals,
)

BUDGET_MS = 50.0
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TIERS, SCOPES = json.dumps(["standard", "batch"]), json.dumps(["inference"])
TOP = 8  # the usage page charts the top 8 owners one by one (gateway/console/usage.py)

SEED_PG = """
INSERT INTO usage_records (request_id, tenant_id, key_id, model, tier, prompt_tokens,
                           completion_tokens, ttft_ms, latency_ms, status, created_at)
SELECT 'bench-' || g,
       1 + t, 1 + t * :keys + (g / :tenants) % :keys,
       'model', (ARRAY['priority', 'standard', 'batch'])[1 + g % 3],
       10 + (g * 7919) % 990, 1 + (g * 104729) % 500, 50, 900,
       CASE WHEN g % 100 = 0 THEN 'error' WHEN g % 100 = 1 THEN 'slo_unattainable' ELSE 'stop' END,
       :now - make_interval(secs => (g * 2654435761::bigint % (:days * 86400))::double precision)
FROM generate_series(1::bigint, :rows) AS g,
     LATERAL (SELECT (floor(:tenants * power(((g * 48271) % 1000003) / 1000003.0, 2)))::int AS t) AS pick
"""


def _database(args) -> tuple[str, callable]:
    """A fresh, empty database and the function that drops it."""
    base = args.database_url or os.environ.get("FAIRLANE_TEST_POSTGRES_URL") or DEFAULT_PG
    name = f"fairlane_bench_{uuid.uuid4().hex[:10]}"
    try:
        server = create_engine(base, isolation_level="AUTOCOMMIT")
        with server.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        if not args.smoke:
            raise SystemExit(f"PostgreSQL at {base} did not answer ({exc}); give --database-url") from None
        folder = tempfile.mkdtemp(prefix="fairlane-bench-db-")
        print(f"no PostgreSQL ({type(exc).__name__}): the smoke run uses SQLite")
        return f"sqlite:///{folder}/bench.db", lambda: None

    def drop() -> None:
        with server.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.dispose()

    return make_url(base).set(database=name).render_as_string(hide_password=False), drop


def seed(url: str, *, rows: int, tenants: int, keys: int, days: int, now: datetime) -> dict:
    """Tenants, keys and ``rows`` usage records at 0003, then the roll-ups by migrating to head."""
    upgrade(url, "0003")
    engine = make_engine(url)
    started = time.perf_counter()
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO tenants (name, weight, default_tier, allowed_tiers, status, created_at) "
                "VALUES (:name, 1.0, 'standard', :tiers, 'active', :now)"
            ),
            [{"name": f"tenant-{t:03d}", "tiers": TIERS, "now": now} for t in range(tenants)],
        )
        connection.execute(
            text(
                "INSERT INTO api_keys (tenant_id, prefix, secret_hash, name, scopes, created_at) "
                "VALUES (:tenant, :prefix, :hash, '', :scopes, :now)"
            ),
            [
                {
                    "tenant": 1 + t,
                    "prefix": f"fl-b{t:03d}k{k:03d}",
                    "hash": "0" * 64,
                    "scopes": SCOPES,
                    "now": now,
                }
                for t in range(tenants)
                for k in range(keys)
            ],
        )
        if engine.dialect.name == "postgresql":
            connection.execute(
                text(SEED_PG), {"rows": rows, "tenants": tenants, "keys": keys, "days": days, "now": now}
            )
        else:
            rng = random.Random(0)
            batch = []
            for g in range(1, rows + 1):
                t = int(tenants * rng.random() ** 2)
                batch.append(
                    {
                        "rid": f"bench-{g}",
                        "t": 1 + t,
                        "k": 1 + t * keys + rng.randrange(keys),
                        "p": rng.randint(10, 999),
                        "c": rng.randint(1, 500),
                        "s": "error" if g % 100 == 0 else "stop",
                        "at": now - timedelta(seconds=rng.uniform(0, days * 86400)),
                    }
                )
            connection.execute(
                text(
                    "INSERT INTO usage_records (request_id, tenant_id, key_id, model, tier, prompt_tokens, "
                    "completion_tokens, status, created_at) VALUES (:rid, :t, :k, 'model', 'standard', :p, "
                    ":c, :s, :at)"
                ),
                batch,
            )
    inserted = time.perf_counter() - started
    started = time.perf_counter()
    upgrade(url)  # 0004 rolls the records up
    rolled = time.perf_counter() - started
    if engine.dialect.name == "postgresql":  # what autovacuum does after a bulk load: statistics, visibility
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM ANALYZE"))
    with engine.begin() as connection:
        counts = {
            "usage_records": connection.scalar(select(func.count()).select_from(UsageRecord)),
            "usage_hourly": connection.scalar(select(func.count()).select_from(UsageHourly)),
        }
    engine.dispose()
    return {"insert_s": round(inserted, 2), "rollup_migration_s": round(rolled, 2), **counts}


def queries(now: datetime) -> dict:
    """name -> fn(session): what each console page asks the database (gateway/console/*.py)."""
    until = hour_of(now) + timedelta(hours=1)
    week = until - timedelta(days=7)
    month = (until - timedelta(days=30)).replace(hour=0)  # day views start at a day's start
    busiest = 1  # seeded tenant 1 has the most records

    def page(since, bucket, **scope):
        """The usage page's three queries: totals per owner, the top owners' series, everything's."""
        by = "key" if scope.get("tenant_id") else "tenant"
        top: list[int] = []

        def totals(s):
            found = usage_totals(s, since=since, until=until, group_by=by, bucket=bucket, **scope)
            top[:] = sorted(found, key=lambda o: -found[o].total_tokens)[:TOP]  # as the page picks them
            return found

        def top_series(s):
            return usage_series(s, since=since, until=until, group_by=by, owners=top, bucket=bucket, **scope)

        def overall(s):
            return usage_series(s, since=since, until=until, bucket=bucket, **scope)

        return totals, top_series, overall

    found = {
        "tenants page: tenants + their quotas": lambda s: (list_tenants(s), tenant_quotas(s)),
        "keys page: a tenant's keys": lambda s: list_api_keys(s, tenant_id=busiest),
    }
    for label, since, bucket, scope in (
        ("every tenant, 7 days per hour", week, "hour", {}),
        ("every tenant, 30 days per day", month, "day", {}),
        ("one tenant by key, 7 days per hour", week, "hour", {"tenant_id": busiest}),
        ("one tenant by key, 30 days per day", month, "day", {"tenant_id": busiest}),
        ("one key, 30 days per day", month, "day", {"tenant_id": busiest, "key_id": 1}),
    ):
        totals, top_series, overall = page(since, bucket, **scope)
        found[f"usage, {label}: totals"] = totals
        found[f"usage, {label}: series of the top {TOP}"] = top_series
        found[f"usage, {label}: overall series"] = overall
    found["CSV: one tenant by key, 30 days per day"] = lambda s: series_csv(
        s, since=month, until=until, tenant_id=busiest, bucket="day"
    )
    found["CSV: every tenant, 30 days per day"] = lambda s: series_csv(
        s, since=month, until=until, bucket="day"
    )
    return found


def measure(url: str, now: datetime, repeats: int) -> dict:
    """Times each query in this process under the garbage-collector policy the gateway's process
    runs with (gateway/telemetry/gc_policy.py: what was alive at start frozen, a higher young
    threshold), so a collection lands where it would land in the server."""
    engine = make_engine(url, pool_size=2) if url.startswith("postgresql") else make_engine(url)
    sessions = make_session_factory(engine)
    thresholds = gc_policy.freeze()
    try:
        return _measure(sessions, now, repeats)
    finally:
        gc_policy.thaw(thresholds)
        engine.dispose()


def _measure(sessions, now: datetime, repeats: int) -> dict:
    results = {}
    for name, fn in queries(now).items():
        times = []
        with sessions() as session:
            fn(session)  # warm: plans cached, pages in memory
            for _ in range(repeats):
                started = time.perf_counter()
                fn(session)
                times.append((time.perf_counter() - started) * 1000)
                session.rollback()
        times.sort()
        results[name] = {
            "p50_ms": round(statistics.median(times), 2),
            "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 2),
            "max_ms": round(times[-1], 2),
        }
        print(f"{results[name]['p50_ms']:8.2f} {results[name]['p99_ms']:8.2f}  {name}")
    writes = []
    with sessions() as session:
        for i in range(max(20, repeats)):
            started = time.perf_counter()
            record_usage(
                session,
                request_id=f"write-{i}",
                tenant_id=1 + i % 5,
                key_id=1 + (i % 5) * 5,
                model="model",
                tier="standard",
                prompt_tokens=100,
                completion_tokens=20,
                status="stop",
            )
            writes.append((time.perf_counter() - started) * 1000)
    writes.sort()
    return {
        "queries": results,
        "record_usage_ms": {
            "p50": round(statistics.median(writes), 2),
            "p99": round(writes[int(0.99 * len(writes))], 2),
        },
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["queries"])
    p50 = [result["queries"][n]["p50_ms"] for n in names]
    p99 = [result["queries"][n]["p99_ms"] for n in names]
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(names) + 1.6))
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], p50, height=0.4, label="p50", color="#2563eb")
    ax.barh([i - 0.2 for i in y], p99, height=0.4, label="p99", color="#93c5fd")
    ax.axvline(BUDGET_MS, color="#dc2626", linestyle="--", label=f"budget {BUDGET_MS:g} ms")
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")  # a stall of the machine must not hide the rest
    ax.set_xlabel("milliseconds (log scale)")
    seeded = result["seed"]
    ax.set_title(
        f"Console queries, {seeded['usage_records']:,} usage records "
        f"({seeded['usage_hourly']:,} roll-up rows), {result['backend']}\nload average "
        f"{result['machine'].get('load_average_1_5_15_min', ['?'])[0]} on {result['machine']['cpus']} CPUs",
        fontsize=10,
    )
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", help="a PostgreSQL server (a fresh database is made on it)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--keys", type=int, default=5, help="per tenant")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=200)
    add_common_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.tenants, args.repeats = 20_000, 20, 10
    out = out_dir(args, "console_queries")
    url, drop = _database(args)
    now = datetime.now(UTC)
    try:
        seeded = seed(url, rows=args.rows, tenants=args.tenants, keys=args.keys, days=args.days, now=now)
        print(f"seeded: {seeded}")
        measured = measure(url, now, args.repeats)
    finally:
        drop()
    load = os.getloadavg()
    worst = max(q["p99_ms"] for q in measured["queries"].values())
    result = {
        "smoke": args.smoke,
        "backend": make_url(url).get_backend_name(),
        "budget_ms": BUDGET_MS,
        "worst_p99_ms": worst,
        "within_budget": worst <= BUDGET_MS,
        "seed": {"tenants": args.tenants, "keys_per_tenant": args.keys, "days": args.days, **seeded},
        "repeats": args.repeats,
        **measured,
        "machine": {**machine(), "load_average_1_5_15_min": [round(x, 1) for x in load]},
    }
    (out / "console_queries.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "console_queries.png")
    print(f"worst p99: {worst:.1f} ms (budget {BUDGET_MS:g} ms)")
    done(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
