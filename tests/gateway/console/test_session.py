"""The console's session cookie: signed with the admin token, expiring, and its CSRF token."""

from __future__ import annotations

from gateway.console.session import SESSION_S, new_cookie, read_cookie, token_matches

SECRET = "console-admin-token-0123456789abcdef"


def test_a_cookie_is_valid_until_it_expires_and_only_under_its_token():
    cookie = new_cookie(SECRET, now=1_000_000)
    session = read_cookie(SECRET, cookie, now=1_000_000 + SESSION_S)
    assert session is not None and len(session.csrf) == 64
    assert read_cookie(SECRET, cookie, now=1_000_000 + SESSION_S + 1) is None  # expired
    assert read_cookie(SECRET, cookie, now=999_999) is None  # from the future
    assert read_cookie("another-admin-token-0123456789abcd", cookie, now=1_000_001) is None
    issued, nonce, signature = cookie.split(".")
    assert read_cookie(SECRET, f"{int(issued) + 10}.{nonce}.{signature}", now=1_000_001) is None
    assert read_cookie(SECRET, "fl-AbCd1234_secret", now=1_000_001) is None  # a tenant key
    assert read_cookie("", cookie, now=1_000_001) is None  # no admin token: no console


def test_each_session_has_its_own_csrf_token():
    first = read_cookie(SECRET, new_cookie(SECRET, now=5), now=6)
    second = read_cookie(SECRET, new_cookie(SECRET, now=5), now=6)
    assert first.csrf != second.csrf
    assert (
        token_matches(SECRET, SECRET) and not token_matches(SECRET, SECRET[:-1]) and not token_matches("", "")
    )
