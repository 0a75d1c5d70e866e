"""The soak's count of what was lost or leaked once its load has ended (see benchmarks.soak): KV
blocks still held, quota leases still open, usage records missing, doubled or of refused requests,
and tokens lost or duplicated against an undisturbed run of each prompt."""

from __future__ import annotations

import difflib
import re
import sqlite3
import time
from pathlib import Path

import httpx


def tokens(text: str) -> list[int]:
    """The token ids of a random-weight model's text (its worker writes each token as ' t<id>')."""
    return [int(t) for t in re.findall(r" t(\d+)", text)]


def kv_blocks_left(redis_url: str, model: str, timeout_s: float = 30.0) -> dict:
    """Blocks held on each live worker once everything has ended (0: all free)."""
    import redis

    from gateway.lanes.keys import WORKER_ALIVE_S, worker_info_key, workers_key

    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout_s
    while True:
        live = client.zrangebyscore(workers_key(model), time.time() - WORKER_ALIVE_S, "+inf")
        infos = [client.hgetall(worker_info_key(model, w.decode())) for w in live]
        held = {
            w.decode(): int(i[b"total_blocks"]) - int(i[b"free_blocks"])
            for w, i in zip(live, infos, strict=True)
            if i
        }
        if (held and not any(held.values())) or time.monotonic() > deadline:
            client.close()
            return held
        time.sleep(0.5)


def leases_left(base_url: str, admin: dict, tenants: list[dict], timeout_s: float = 30.0) -> dict:
    """Each tenant's quota leases still in flight (admin API), once they have had time to settle."""
    deadline = time.monotonic() + timeout_s
    while True:
        in_flight = {
            t["id"]: httpx.get(
                f"{base_url}/admin/tenants/{t['id']}/quota/usage", headers=admin, timeout=10
            ).json()["in_flight"]
            for t in tenants
        }
        if not any(in_flight.values()) or time.monotonic() > deadline:
            return {k: v for k, v in in_flight.items() if v}
        time.sleep(0.5)


def usage_records(db: Path) -> dict[str, list[tuple]]:
    """(status, completion_tokens) of every usage record, by request id."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT request_id, status, completion_tokens FROM usage_records"
        ).fetchall()
    records: dict[str, list[tuple]] = {}
    for request_id, status, completion_tokens in rows:
        records.setdefault(request_id, []).append((status, completion_tokens))
    return records


def counter(base_url: str, name: str) -> float:
    """A counter of the workers, summed over its labels, from serve's /metrics."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def check(soak, db: Path, model: str) -> dict:
    """Everything counted after a soak (a benchmarks.soak.Soak that has run) on serve's database."""
    base_url = soak.served.base_url
    kv = kv_blocks_left(soak.served.redis_url, model)
    leases = leases_left(base_url, soak.admin, soak.tenants)
    time.sleep(1.0)  # the last usage records are written after each response
    records = usage_records(db)
    results = soak.results
    ours = {r["request_id"] for r in results if r["request_id"]}
    admitted = [r for r in results if r["status"] == 200 or r["error"] in ("interrupted", "timeout")]
    missing = [r["request_id"] for r in admitted if r["request_id"] not in records]
    refused = [r for r in results if r not in admitted]
    recorded_refusals = [r["request_id"] for r in refused if r["request_id"] in records]
    twice = [rid for rid, rows in records.items() if len(rows) > 1]
    unknown = [rid for rid in records if rid not in ours]  # (the reference runs are known too, below)
    lost = extra = 0
    finished = [r for r in results if r["finish"] == "length" and r["error"] is None and not r["dropped"]]
    short_records, wrong_tokens = [], []
    for r in finished:
        got, want = tokens(r["text"]), soak.reference[r["prompt"]]
        diff = [
            op
            for op in difflib.SequenceMatcher(a=want, b=got, autojunk=False).get_opcodes()
            if op[0] != "equal"
        ]
        for tag, i1, i2, j1, j2 in diff:
            if tag in ("delete", "replace"):
                lost += i2 - i1
            if tag in ("insert", "replace"):
                extra += j2 - j1
        if diff:
            wrong_tokens.append(
                {
                    "request_id": r["request_id"],
                    "stream": r["stream"],
                    "ended_at": r["at"],
                    "usage": r["usage"],
                    "expected": len(want),
                    "got": len(got),
                    "diff": diff,
                }
            )
        rows = records.get(r["request_id"], [])
        if rows and rows[0][1] != len(want):
            short_records.append(r["request_id"])
    return {
        "admissions": counter(base_url, "fairlane_engine_admissions_total"),
        "preemptions": counter(base_url, "fairlane_engine_preemptions_total"),
        "kv_blocks_held": kv,
        "quota_leases_held": leases,
        "admitted": len(admitted),
        "refused": len(refused),
        "usage_records": len(records),
        "missing_usage_records": len(missing),
        "usage_records_of_refused_requests": len(recorded_refusals),
        "duplicate_usage_records": len(twice),
        "usage_records_of_unknown_requests": max(0, len(unknown) - len(soak.reference)),
        "finished_compared": len(finished),
        "lost_tokens": lost,
        "duplicated_tokens": extra,
        "records_with_wrong_token_count": len(short_records),
        "examples": {
            "missing": missing[:5],
            "recorded_refusals": recorded_refusals[:5],
            "twice": twice[:5],
            "wrong_count": short_records[:5],
            "wrong_tokens": wrong_tokens[:5],
        },
    }


def passed(checks: dict) -> bool:
    return (
        bool(checks["kv_blocks_held"])
        and not any(checks["kv_blocks_held"].values())
        and not checks["quota_leases_held"]
        and not checks["missing_usage_records"]
        and not checks["usage_records_of_refused_requests"]
        and not checks["duplicate_usage_records"]
        and not checks["usage_records_of_unknown_requests"]
        and not checks["lost_tokens"]
        and not checks["duplicated_tokens"]
        and not checks["records_with_wrong_token_count"]
    )


def outcome(r: dict) -> str:
    if r["dropped"]:
        return "dropped by client"
    if r["status"] == 200:
        return "finished" if r["error"] is None else f"cut: {r['error']}"
    return f"{r['status']}: {r['error']}"
