"""``fairlane serve``'s look at a Redis it was given, before it starts anything: a server that
answers but refuses the URL's password or user, or its database number, can never serve, so serve
stops in one line naming the setting (the URL's password hidden). A server that does not answer
may come back: serve starts, and /ready says not ready until it does.

Without this, a wrong password looked like an outage (every request a 503, for ever) and a
database number the server does not have started a "healthy" gateway whose worker crash-looped.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis as redislib
from redis.exceptions import AuthenticationError, ResponseError

log = logging.getLogger("fairlane.serve")
CONNECT_TIMEOUT_S = 2.0  # a server that does not answer in this long is left to /ready
SECRET_PARAMS = frozenset({"password"})  # redis-py also reads the password from the query


def shown_url(url: str) -> str:
    """``url`` with its password (in the authority or the query) as ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}{':***' if colon else ''}@{host}" if colon or user else f"@{host}"
    query = urlencode(
        [(k, "***" if k.lower() in SECRET_PARAMS else v) for k, v in parse_qsl(parts.query, True)],
        safe="*",
    )
    # by hand: urlunsplit drops the "//" of an empty authority (unix:///path)
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def redis_refusal(url: str, setting: str) -> str | None:
    """Why the Redis at ``url`` (the value of ``setting``) can never serve, or None: it answers
    PING, or does not answer now (an outage may end)."""
    shown = shown_url(url)
    client = redislib.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=5.0)
    try:
        client.ping()
    except AuthenticationError as exc:
        parts = urlsplit(url)
        if parts.password is None and "password" not in parts.query.lower():
            why = "the server requires a password and the URL has none"
        else:
            why = _first_line(exc).rstrip(".")
        return (
            f"authentication to Redis failed at {shown} ({setting}): {why} "
            "(check the URL's user and password)"
        )
    except ResponseError as exc:
        hint = ""
        if "DB index" in str(exc):
            hint = " (the number after the port selects a database: /0 is on every server)"
        return f"Redis at {shown} ({setting}) refused the connection: {_first_line(exc).rstrip('.')}{hint}"
    except (redislib.ConnectionError, redislib.TimeoutError, OSError) as exc:
        log.warning(
            "Redis at %s (%s) does not answer now (%s): starting anyway; /ready says not ready until it does",
            shown,
            setting,
            _first_line(exc),
        )
    finally:
        client.close()
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
