"""OpenAI's x-ratelimit-* and retry-after headers from a Decision."""

from __future__ import annotations

import pytest

from quotas import Decision, RateInfo, format_duration, rate_limit_headers, refunded, retry_headers


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0ms"),
        (0.02, "20ms"),
        (0.0201, "21ms"),
        (0.999, "999ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (6.25, "6.25s"),
        (59.9991, "1m0s"),
        (360, "6m0s"),
        (90.5, "1m30.5s"),
        (3723, "1h2m3s"),
        (-1, "0ms"),
    ],
)
def test_durations_are_written_like_openai(seconds, text):
    assert format_duration(seconds) == text


def test_allowed_decision_headers():
    d = Decision(True, requests=RateInfo(60, 59, 1.0), tokens=RateInfo(150_000, 149_984, 0.0064))
    assert rate_limit_headers(d) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "7ms",
    }


def test_refusal_adds_retry_after_rounded_up():
    d = Decision(
        False, limit="tokens_per_minute", scope="tenant", retry_after=2.0004, tokens=RateInfo(1000, 3, 59.0)
    )
    headers = rate_limit_headers(d)
    assert headers["retry-after"] == "3" and headers["retry-after-ms"] == "2001"
    assert "x-ratelimit-limit-requests" not in headers  # requests are not limited
    assert headers["x-ratelimit-reset-tokens"] == "59s"
    assert d.message == (
        "Rate limit reached for the organization's tokens per minute "
        "(prompt + max_tokens). Please try again in 2s."
    )


def test_permanent_refusal_has_no_retry_after():
    d = Decision(False, limit="max_tokens", scope="key", retry_after=None)
    assert rate_limit_headers(d) == {} and not d.retryable
    assert "API key's max_tokens per request" in d.message and "never" in d.message


@pytest.mark.parametrize(
    "seconds, header",
    [
        (0.0001, {"retry-after": "1", "retry-after-ms": "1"}),
        (1.0, {"retry-after": "1", "retry-after-ms": "1000"}),
        (59.998946, {"retry-after": "60", "retry-after-ms": "59999"}),
    ],
)
def test_retry_headers(seconds, header):
    assert retry_headers(seconds) == header


def test_a_spent_budget_says_when_it_renews_as_a_duration():
    """A budget renews hours away: its message was 'Please try again in 6.82e+04s.'"""
    d = Decision(False, limit="daily_budget", scope="tenant", retry_after=68209.6)
    assert d.message == (
        "The organization's daily token budget is spent for this request; it renews at the end of "
        "the UTC day, in 18h56m49.6s."
    )
    monthly = Decision(False, limit="monthly_budget", scope="key", retry_after=3600)
    assert monthly.message.startswith("The API key's monthly token budget")
    assert "month, in 1h0m0s" in monthly.message


def test_a_refund_gives_the_headers_their_request_and_tokens_back():
    d = Decision(True, requests=RateInfo(10, 8, 12.0), tokens=RateInfo(600, 100, 59.0))
    back = refunded(d, 40)
    assert back.requests == RateInfo(10, 9, 6.0) and back.tokens == RateInfo(600, 140, 55.0)
    assert refunded(Decision(True, tokens=RateInfo(600, 590, 1.0)), 40).tokens == RateInfo(600, 600, 0.0)
