"""The official openai client's own retry-after parsing, fed the headers of real refusals:
it waits long enough, and not longer than a millisecond beyond the window."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI

from quotas import Demand, QuotaLimits, rate_limit_headers

START = 1_700_000_000.0


@pytest.mark.parametrize(
    "limits, demand",
    [
        (QuotaLimits(requests_per_minute=7), Demand("acme", 1, 1)),
        (QuotaLimits(tokens_per_minute=1000), Demand("acme", 90, 53)),  # 143 tokens: 6 fit
    ],
)
async def test_client_retry_after_the_window_succeeds(store, limiter, limits, demand):
    await store.put("acme", limits)
    while (await limiter.admit(demand, now=START)).allowed:
        pass
    refused = await limiter.admit(demand, now=START)
    assert refused.retryable
    headers = rate_limit_headers(refused)
    client = AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")  # never called
    wait = client._parse_retry_after_header(headers)  # what the client's retry loop sleeps
    assert refused.retry_after <= wait < refused.retry_after + 0.001
    assert not (await limiter.admit(demand, now=START + refused.retry_after - 0.001)).allowed
    assert (await limiter.admit(demand, now=START + wait)).allowed
