"""The admission client: commands packed in C give redis-py's bytes, on TCP only."""

from __future__ import annotations

import pytest
from redis.asyncio import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from quotas import connect
from quotas.client import PackingConnection

ARGS = [
    ("EVALSHA", "ab" * 20, 2, "k:{t}", b"raw\x00bytes", 0, -7, 10**18, 0.1, 1e20, "é", ""),
    ("SCRIPT LOAD", "return 1"),  # a two-word command is sent as two arguments
    (b"CLIENT SETNAME", "n"),
]


@pytest.mark.parametrize("args", ARGS)
def test_packing_matches_redis_py(args):
    fast = PackingConnection().pack_command(*args)
    slow = Connection().pack_command(*args)
    assert b"".join(fast) == b"".join(slow)


def test_other_types_follow_redis_py_rules():
    conn = PackingConnection()
    with pytest.raises(DataError):  # redis-py refuses booleans
        conn.pack_command("SET", "k", True)
    view = memoryview(b"payload")
    assert b"".join(conn.pack_command("SET", "k", view)) == b"".join(
        Connection().pack_command("SET", "k", view)
    )


def test_non_default_encoding_takes_redis_py_path():
    conn = PackingConnection(encoding="latin-1")
    assert b"".join(conn.pack_command("SET", "k", "é")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xe9\r\n"


async def test_tcp_url_packs_in_c_unix_url_keeps_its_class():
    tcp = connect("redis://127.0.0.1:6379/0")
    unix = connect("unix:///tmp/none.sock")
    assert tcp.connection_pool.connection_class is PackingConnection
    assert unix.connection_pool.connection_class is UnixDomainSocketConnection
    assert await tcp.ping()
    await tcp.aclose()
    await unix.aclose()
