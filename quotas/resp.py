"""A lean asyncio Redis connection for the calls on every request's path.

redis-py's asyncio client costs 70-130 µs of Python per command back to back, and several times
that after the process sat idle for a few milliseconds (benchmarks/idle_wakeup.py): its pool,
retry, lock and timeout objects all run cold. ``RespConnection`` is one connection, an asyncio
protocol over the hiredis reader: a call packs its command in C, writes it and awaits a future
that the protocol resolves when its reply comes. Calls from many tasks share the connection,
pipelined: Redis answers in order, so replies resolve the futures in the order they were sent.

It keeps redis-py's contract for its callers: the same replies (bytes, ints, lists; RESP2 as it
comes, without redis-py's per-command callbacks, which scripts' replies never have), error replies
raised as redis-py's exception classes (``NoScriptError``, ``ReadOnlyError``, …), and a broken or
slow connection raised as redis-py's ``ConnectionError`` / ``TimeoutError``, so ``except`` clauses
written for redis-py hold. A call that finds its connection closed (Redis restarted since the last
call) connects again first; a connect that fails is tried ``retries`` more times after 10 ms, 20 ms,
…; a command already sent is never sent again (a script may have run), it fails. A reply slower
than ``timeout`` fails its call with ``TimeoutError`` and closes the connection (the replies after
it would be out of step), as redis-py does.

Plain TCP and unix sockets only: ``for_client`` answers None for a TLS client (its caller keeps
redis-py's path).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import socket
from typing import Any

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError


class _Protocol(asyncio.Protocol):
    """Replies in, futures resolved in the order their commands went out."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: collections.deque[asyncio.Future] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                future = self.waiting.popleft()
                if future.done():  # its caller was cancelled or timed out: the reply is dropped
                    continue
                if isinstance(reply, hiredis.ReplyError):
                    future.set_exception(BaseParser.parse_error(str(reply)))
                else:
                    future.set_result(reply)
        except (hiredis.ProtocolError, IndexError) as exc:  # garbage, or a reply nobody asked for
            self.fail(RedisConnectionError(f"Redis protocol error: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail_waiting(RedisConnectionError(f"Connection to Redis lost: {exc or 'closed by the server'}"))

    def fail(self, error: Exception) -> None:
        """Close the connection; every call waiting on it fails with ``error``."""
        self.closed = True
        self._fail_waiting(error)
        if self.transport is not None:
            self.transport.abort()

    def _fail_waiting(self, error: Exception) -> None:
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


class RespConnection:
    """One lazily opened, pipelined connection to Redis (asyncio; see the module docstring)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout: float | None = 0.5,
        connect_timeout: float | None = 0.5,
        retries: int = 1,
        client_name: str | None = None,
    ) -> None:
        self.host, self.port, self.path, self.db = host, port, path, db
        self.username, self.password = username, password
        self.timeout, self.connect_timeout, self.retries = timeout, connect_timeout, retries
        self.client_name = client_name
        self._protocol: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Future | None = None

    @classmethod
    def for_client(cls, client: Redis) -> RespConnection | None:
        """A connection to where ``client`` connects, with its timeouts and credentials; None when
        it uses TLS or another connection class this module does not speak."""
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        kind = pool.connection_class  # redis-py's, or derived (quotas/client.py, gateway/lanes/connect.py)
        unix = issubclass(kind, UnixDomainSocketConnection)
        if issubclass(kind, SSLConnection) or not (unix or issubclass(kind, Connection)):
            return None
        if kwargs.get("encoding", "utf-8") != "utf-8" or kwargs.get("decode_responses"):
            return None
        retry = kwargs.get("retry")
        return cls(
            host=kwargs.get("host", "127.0.0.1"),
            port=int(kwargs.get("port", 6379)),
            path=kwargs.get("path") if unix else None,
            db=int(kwargs.get("db", 0) or 0),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            timeout=kwargs.get("socket_timeout"),
            connect_timeout=kwargs.get("socket_connect_timeout") or kwargs.get("socket_timeout"),
            retries=retry.get_retries() if retry is not None else 0,
            client_name=kwargs.get("client_name"),
        )

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply (raises as the module docstring says)."""
        protocol = self._protocol
        if protocol is None or protocol.closed or self._loop is not asyncio.get_running_loop():
            protocol = await self._connect()
        loop = self._loop
        assert loop is not None and protocol.transport is not None
        future = loop.create_future()
        try:
            payload = hiredis.pack_command(args)
        except TypeError as exc:
            raise DataError(f"cannot encode a Redis command argument: {exc}") from None
        protocol.waiting.append(future)
        protocol.transport.write(payload)
        if self.timeout is None:
            return await future
        timer = loop.call_later(self.timeout, self._expire, protocol, future)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, protocol: _Protocol, future: asyncio.Future) -> None:
        if not future.done():
            future.set_exception(RedisTimeoutError(f"Redis did not reply within {self.timeout} s"))
            protocol.fail(RedisConnectionError("Connection to Redis closed after a reply timed out"))

    async def _connect(self) -> _Protocol:
        """Open the connection: one opening at a time, in a task of its own, so that a caller
        cancelled while it waits does not cancel it for the callers waiting with it."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): the old connection is unusable there
            self._protocol, self._connecting, self._loop = None, None, loop
        if self._connecting is None:
            self._connecting = loop.create_task(self._open_with_retries())
            self._connecting.add_done_callback(self._opened)
        return await asyncio.shield(self._connecting)

    def _opened(self, task: asyncio.Future) -> None:
        if self._connecting is task:
            self._connecting = None
            if not task.cancelled() and task.exception() is None:
                self._protocol = task.result()
        elif not task.cancelled() and task.exception() is None:
            task.result().fail(RedisConnectionError("superseded"))  # opened for a loop no longer used

    async def _open_with_retries(self) -> _Protocol:
        delay = 0.01
        for attempt in range(self.retries + 1):
            try:
                return await self._open()
            except (OSError, RedisConnectionError, RedisTimeoutError, TimeoutError) as exc:
                if attempt == self.retries:
                    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
                        raise
                    raise RedisConnectionError(f"Error connecting to Redis: {exc!r}") from exc
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.1)
        raise AssertionError("unreachable")

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        if self.path is not None:
            opening = loop.create_unix_connection(_Protocol, self.path)
        else:
            opening = loop.create_connection(_Protocol, self.host, self.port)
        try:
            _, protocol = await asyncio.wait_for(opening, self.connect_timeout)
        except TimeoutError:
            raise RedisTimeoutError("Timeout connecting to Redis") from None
        try:
            if self.password is not None:
                auth = (self.username, self.password) if self.username else (self.password,)
                await self._handshake(protocol, "AUTH", *auth)
            if self.db:
                await self._handshake(protocol, "SELECT", self.db)
            if self.client_name:
                await self._handshake(protocol, "CLIENT", "SETNAME", self.client_name)
        except BaseException:
            protocol.fail(RedisConnectionError("handshake failed"))
            raise
        return protocol

    async def _handshake(self, protocol: _Protocol, *args: Any) -> None:
        assert protocol.transport is not None
        future = asyncio.get_running_loop().create_future()
        protocol.waiting.append(future)
        protocol.transport.write(hiredis.pack_command(args))
        try:
            await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            raise RedisTimeoutError("Redis did not answer the handshake") from None

    async def aclose(self) -> None:
        """Close the connection (a later call opens a new one)."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None and not protocol.closed:
            protocol.fail(RedisConnectionError("Connection closed by the client"))


class RespScript:
    """A Lua script called with EVALSHA over a ``RespConnection``, loaded again on NOSCRIPT
    (a restarted or flushed server); called as redis-py's ``AsyncScript`` is."""

    def __init__(self, connection: RespConnection, script: str) -> None:
        self.connection, self.script = connection, script
        self.sha = hashlib.sha1(script.encode()).hexdigest()

    async def __call__(self, keys: list | tuple = (), args: list | tuple = ()) -> Any:
        try:
            return await self.connection.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.connection.execute("SCRIPT", "LOAD", self.script)
            return await self.connection.execute("EVALSHA", self.sha, len(keys), *keys, *args)
