"""``fairlane admin``: tenants, keys, quotas and usage for scripts, against a running gateway (its
admin REST API, with the admin token) or straight on the database (``--database-url``).

    fairlane admin tenants list
    fairlane admin tenants create acme --weight 2 --allowed-tiers standard,batch
    fairlane admin tenants update acme --weight 3 --tier-share batch=0.5 | --disable
    fairlane admin keys create acme --name ci          # prints the secret, once
    fairlane admin keys revoke 12
    fairlane admin quotas set acme --rpm 600 --daily-tokens 1000000 [--key 12]
    fairlane admin usage --tenant acme --since 2026-11-01 [--bucket day] --csv

Results are JSON on stdout (``tenants list``: a table, ``--json`` for JSON; ``usage --csv``: CSV);
a refused operation prints its reason on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import UTC, datetime

DEFAULT_URL = "http://127.0.0.1:8000"
QUOTA_OPTIONS = {  # option -> QuotaSet field
    "rpm": "requests_per_minute",
    "tpm": "tokens_per_minute",
    "max_concurrency": "max_concurrency",
    "daily_tokens": "daily_token_budget",
    "monthly_tokens": "monthly_token_budget",
    "max_tokens": "max_tokens_per_request",
}


def _tiers(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


def _share(value: str) -> tuple[str, float]:
    tier, _, share = value.partition("=")
    try:
        return tier.strip(), float(share)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TIER=FRACTION, got {value!r}") from None


def _when(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO date or time, got {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("FAIRLANE_URL", DEFAULT_URL), help="the gateway")
    parser.add_argument("--token", help="the admin token (default: $FAIRLANE_ADMIN_TOKEN)")
    parser.add_argument("--database-url", help="work on this database instead of a gateway")
    parser.add_argument(
        "--redis-url", help="with --database-url: the gateways' Redis, to push changes at once"
    )
    parser.add_argument(
        "--quota-key-prefix", default="", help="with --redis-url: the gateways' quota_key_prefix"
    )
    parser.add_argument("--json", action="store_true", help="JSON output for listings")
    groups = parser.add_subparsers(dest="group", required=True)

    tenants = groups.add_parser("tenants", help="list, create, update tenants").add_subparsers(
        dest="action", required=True
    )
    listing = tenants.add_parser("list", help="every tenant")
    # after the subcommand too; absent there, the option before it stands
    listing.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON output")
    for action in ("create", "update"):
        p = tenants.add_parser(action, help=f"{action} a tenant")
        p.add_argument("tenant", help="name (create) or name or id (update)")
        p.add_argument("--weight", type=_finite, help="share of the engine under contention")
        p.add_argument("--default-tier")
        p.add_argument("--allowed-tiers", type=_tiers, help="comma-separated")
        p.add_argument("--ttft-target", type=_finite, help="seconds; over the tier's")
        p.add_argument("--tpot-target", type=_finite, help="seconds; over the tier's")
        if action == "update":
            p.add_argument("--name", help="rename")
            status = p.add_mutually_exclusive_group()
            status.add_argument("--disable", action="store_true")
            status.add_argument("--enable", action="store_true")

    keys = groups.add_parser("keys", help="create and revoke API keys").add_subparsers(
        dest="action", required=True
    )
    create = keys.add_parser("create", help="a new key; its secret is printed this once")
    create.add_argument("tenant", help="name or id")
    create.add_argument("--name", default="")
    create.add_argument("--scopes", type=_tiers, default=["inference"], help="comma-separated")
    keys.add_parser("revoke", help="revoke a key").add_argument("key_id", type=int)

    quotas = groups.add_parser("quotas", help="set a tenant's or key's limits").add_subparsers(
        dest="action", required=True
    )
    quota = quotas.add_parser("set", help="replace the quota (limits not given: unlimited)")
    quota.add_argument("tenant", help="name or id")
    quota.add_argument("--key", type=int, help="a key id of the tenant: set its own quota")
    for option, field in QUOTA_OPTIONS.items():
        quota.add_argument(f"--{option.replace('_', '-')}", type=int, help=field)
    quota.add_argument("--allowed-tiers", type=_tiers)
    quota.add_argument("--tier-share", type=_share, action="append", help="TIER=FRACTION (repeatable)")

    usage = groups.add_parser("usage", help="usage per hour or day, from the hourly roll-ups")
    usage.add_argument("--tenant", help="name or id (default: every tenant)")
    usage.add_argument("--key", type=int, help="one key id")
    usage.add_argument("--since", type=_when, required=True, help="ISO date or time (UTC unless given)")
    usage.add_argument("--until", type=_when)
    usage.add_argument("--bucket", choices=("hour", "day"), default="hour")
    usage.add_argument("--csv", action="store_true", help="CSV instead of JSON")


def _backend(args: argparse.Namespace):
    from gateway.cli.admin_backends import AdminError, DatabaseBackend, HttpBackend

    if args.database_url:
        return DatabaseBackend(
            args.database_url, redis_url=args.redis_url, quota_prefix=args.quota_key_prefix
        )
    token = args.token or os.environ.get("FAIRLANE_ADMIN_TOKEN")
    if not token:
        raise AdminError("give --token (or FAIRLANE_ADMIN_TOKEN), or --database-url")
    return HttpBackend(args.url, token)


def _finite(text: str) -> float:
    """A number argument: nan and inf are refused (no weight or latency target takes them)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _tenant_id(backend, ref: str) -> int:
    from gateway.cli.admin_backends import AdminError

    tenants = backend.tenants()
    by_name = [t["id"] for t in tenants if t["name"] == ref]
    by_id = [t["id"] for t in tenants if str(t["id"]) == ref]
    if by_name and by_id and by_name != by_id:  # a tenant named "1" and the tenant whose id is 1
        raise AdminError(
            f"{ref!r} is the name of tenant {by_name[0]} and the id of tenant {by_id[0]}: "
            "rename the first, or give the second's name"
        )
    if not (by_name or by_id):
        raise AdminError(f"tenant {ref!r} not found")
    return (by_name or by_id)[0]


def _tenant_fields(args: argparse.Namespace) -> dict:
    fields = {
        "weight": args.weight,
        "default_tier": args.default_tier,
        "allowed_tiers": args.allowed_tiers,
        "ttft_target_s": args.ttft_target,
        "tpot_target_s": args.tpot_target,
    }
    if args.action == "update":
        fields["name"] = args.name
        fields["status"] = "disabled" if args.disable else "active" if args.enable else None
    return {k: v for k, v in fields.items() if v is not None}


def run(args: argparse.Namespace, backend) -> object:
    group, action = args.group, getattr(args, "action", None)
    if group == "tenants" and action == "list":
        return backend.tenants()
    if group == "tenants" and action == "create":
        return backend.create_tenant(name=args.tenant, **_tenant_fields(args))
    if group == "tenants":
        return backend.update_tenant(_tenant_id(backend, args.tenant), **_tenant_fields(args))
    if group == "keys" and action == "create":
        return backend.create_key(_tenant_id(backend, args.tenant), name=args.name, scopes=args.scopes)
    if group == "keys":
        return backend.revoke_key(args.key_id)
    if group == "quotas":
        limits = {field: getattr(args, option) for option, field in QUOTA_OPTIONS.items()}
        limits["allowed_tiers"] = args.allowed_tiers
        limits["tier_shares"] = dict(args.tier_share) if args.tier_share else None
        limits = {k: v for k, v in limits.items() if v is not None}
        return backend.set_quota(_tenant_id(backend, args.tenant), args.key, limits)
    tenant_id = _tenant_id(backend, args.tenant) if args.tenant else None
    return backend.usage(
        tenant_id=tenant_id,
        key_id=args.key,
        since=args.since,
        until=args.until,
        bucket=args.bucket,
        csv=args.csv,
    )


def _table(tenants: list[dict]) -> str:
    rows = [("ID", "NAME", "WEIGHT", "DEFAULT", "TIERS", "STATUS")]
    rows += [
        (
            str(t["id"]),
            t["name"],
            f"{t['weight']:g}",
            t["default_tier"],
            ",".join(t["allowed_tiers"]),
            t["status"],
        )
        for t in tenants
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def main(args: argparse.Namespace) -> int:
    from gateway.cli.admin_backends import AdminError  # the API's schemas: loaded when a command runs

    try:
        result = run(args, _backend(args))
    except AdminError as exc:
        print(f"fairlane admin: {exc}", file=sys.stderr)
        return 1
    if isinstance(result, str):
        sys.stdout.write(result)
    elif args.group == "tenants" and args.action == "list" and not args.json:
        print(_table(result))
    else:
        print(json.dumps(result, indent=2))
    return 0
