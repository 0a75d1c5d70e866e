"""What is limited (QuotaLimits, Demand), its encoding for the Lua, and the key layout."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from quotas import Demand, KeySpace, QuotaLimits
from quotas.codec import decode_limits, encode_limits

FULL = QuotaLimits(
    requests_per_minute=60,
    tokens_per_minute=90_000,
    max_concurrency=4,
    daily_token_budget=1_000_000,
    monthly_token_budget=20_000_000,
    max_tokens_per_request=4096,
    allowed_tiers={"default", "batch"},
    tier_shares={"batch": 0.5},
)


@pytest.mark.parametrize("limits", [FULL, QuotaLimits(), QuotaLimits(allowed_tiers=set())])
def test_limits_round_trip_through_the_hash(limits):
    fields = encode_limits(limits)
    assert fields["v"] == "1"
    assert decode_limits({k.encode(): v.encode() for k, v in fields.items()}) == limits


def test_hash_encoding_is_what_admit_lua_reads():
    assert encode_limits(FULL) == {
        "v": "1",
        "rpm": "60",
        "tpm": "90000",
        "conc": "4",
        "day": "1000000",
        "month": "20000000",
        "maxtok": "4096",
        "tiers": ",batch,default,",
        "shares": "batch=0.5",
    }
    assert decode_limits({}) is None


def test_limits_from_a_tenancy_row():
    class Row:  # the tenancy Quota row's columns, duck-typed (quotas imports no tenancy)
        requests_per_minute, tokens_per_minute, max_concurrency = 60, 90_000, 4
        daily_token_budget, monthly_token_budget, max_tokens_per_request = 1_000_000, 20_000_000, 4096
        allowed_tiers, tier_shares = ["default", "batch"], {"batch": 0.5}

    assert QuotaLimits.from_row(Row()) == FULL
    assert QuotaLimits.from_row({"requests_per_minute": 5, "allowed_tiers": None}) == QuotaLimits(
        requests_per_minute=5
    )
    assert hash(FULL) == hash(QuotaLimits.from_row(Row()))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"requests_per_minute": -1},
        {"tokens_per_minute": 1.5},
        {"max_concurrency": True},
        {"tokens_per_minute": 100_000_001},
        {"tier_shares": {"batch": 0}},
        {"tier_shares": {"batch": 1.5}},
        {"allowed_tiers": {"a,b"}},
    ],
)
def test_invalid_limits_are_refused(kwargs):
    with pytest.raises(ValueError):
        QuotaLimits(**kwargs)


def test_demand_reserves_prompt_plus_max_tokens_and_checks_names():
    assert Demand("acme", 100, 400).tokens == 500
    for bad in ({"tenant": "a{b}"}, {"tenant": ""}, {"key": "k*"}, {"tier": "x y"}):
        with pytest.raises(ValueError):
            Demand(**({"tenant": "acme", "prompt_tokens": 1, "max_tokens": 1} | bad))
    with pytest.raises(ValueError):
        Demand("acme", -1, 1)


def test_every_key_of_a_tenant_is_in_one_cluster_slot():
    ks = KeySpace("p")
    keys = [ks.reservation("acme", "r1")]
    for key in (None, "k1"):  # lua/state.lua builds the same names from the scope bases
        keys += [
            ks.limits("acme", key),
            ks.state("acme", key),
            ks.leases("acme", key),
            ks.leases("acme", key, "batch"),
        ]
    assert len(set(keys)) == 9
    assert {key_slot(k.encode()) for k in keys} == {key_slot(b"acme")}
    assert ks.scopes("acme", None) == (ks.scope("acme"), "")
