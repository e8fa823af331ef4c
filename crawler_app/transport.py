"""A lean HTTP/1.1 transport for httpx that connects only to guard-checked addresses.

httpx stays the client (requests, responses, headers, content decoding); this
module replaces what sits under it, httpcore's connection pool and h11, which
cost most of a fetch's CPU time on a busy agent. It speaks the part of HTTP/1.1
a page checker needs: ``GET`` and ``HEAD`` without a request body; responses
framed by ``Content-Length``, ``chunked`` transfer coding or the end of the
connection; keep-alive connections reused per host; TLS with the host name as
server name (SNI) and for the certificate check.

**Pinning.** Every request must carry, in its ``extensions`` under
:data:`PINNED`, the :class:`~crawler_app.guard.CheckedTarget` the SSRF guard
returned for its URL; the transport connects to exactly that checked address
and refuses a request without one, or whose URL names another host or port.
Connections are pooled by scheme, host name, port *and* address, so a kept
connection is never reused for another host name or for an address the guard
did not check this time.

Timeouts come from the request's ``timeout`` extension (httpx sets it):
``connect`` (TCP and TLS), ``read`` (longest wait for a byte from the server)
and ``pool`` (longest wait for a free connection). Bodies are streamed to the
reader, who enforces its own size limit by stopping early; the transport never
buffers more than :data:`HIGH_WATER` bytes ahead of the reader.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx

from .guard import CheckedTarget

#: Key in ``httpx.Request.extensions`` that holds the request's guard-checked target.
PINNED = "jodl.pinned_target"
#: Connections open at once (in use and idle), all hosts together.
MAX_CONNECTIONS = 100
#: Seconds an idle connection is kept for reuse.
KEEPALIVE_EXPIRY = 5.0
#: Longest response head (status line and headers) read, in bytes.
MAX_HEAD_BYTES = 64 * 1024
#: Bytes buffered ahead of the reader before the socket stops being read.
HIGH_WATER = 256 * 1024
#: Longest chunk-size line of a chunked body, in bytes.
MAX_CHUNK_LINE = 4096

_NO_BODY_STATUSES = frozenset({204, 304})


class _Stale(Exception):
    """A reused connection closed before the server answered: safe to retry once."""


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: a receive buffer the request coroutine reads from."""

    def __init__(self, key: tuple[str, str, int, str]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.in_use = True
        self.reused = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.in_use:
            self.eof = True  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        self.buffer += data
        if len(self.buffer) > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- used by the request coroutine ----------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self.eof and self.transport is not None and not self.transport.is_closing()

    async def more(self, timeout: float | None) -> None:
        """Wait until more bytes arrive or the server closes; ReadTimeout after ``timeout``."""
        if self.eof:
            raise httpx.RemoteProtocolError("the server closed the connection mid-response")
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def take(self, size: int) -> bytes:
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def line(self, timeout: float | None, limit: int) -> bytes:
        """One line (without its line end), waiting for it to arrive."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                return self.take(end + 1).rstrip(b"\r\n")
            if len(self.buffer) > limit:
                raise httpx.RemoteProtocolError("line too long in the response")
            await self.more(timeout)

    def close(self) -> None:
        self.eof = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("no data from the server within the read timeout"))


class _Body(httpx.AsyncByteStream):
    """A response body read from its connection as the reader asks for it."""

    def __init__(
        self,
        pool: PinnedTransport,
        conn: _Connection,
        framing: str,
        length: int,
        keep: bool,
        timeout: float | None,
    ) -> None:
        self._pool = pool
        self._conn = conn
        self._framing = framing  # "length", "chunked" or "close"
        self._left = length  # bytes left for "length"
        self._keep = keep
        self._timeout = timeout
        self._complete = framing == "length" and length == 0
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._complete or self._closed:
            return
        try:
            if self._framing == "length":
                async for chunk in self._by_length():
                    yield chunk
            elif self._framing == "chunked":
                async for chunk in self._chunked():
                    yield chunk
            else:
                async for chunk in self._until_close():
                    yield chunk
        except BaseException:
            self._keep = False
            raise

    async def _by_length(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while self._left:
            if not conn.buffer:
                await conn.more(self._timeout)
                if not conn.buffer:
                    continue
            data = conn.take(self._left)
            self._left -= len(data)
            if not self._left:
                self._complete = True
            yield data

    async def _chunked(self) -> AsyncIterator[bytes]:
        conn, timeout = self._conn, self._timeout
        while True:
            size_line = await conn.line(timeout, MAX_CHUNK_LINE)
            size_text = size_line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            if size < 0:
                raise httpx.RemoteProtocolError("negative chunk size")
            if size == 0:
                while await conn.line(timeout, MAX_HEAD_BYTES):  # trailers, ignored
                    pass
                self._complete = True
                return
            while size:
                if not conn.buffer:
                    await conn.more(timeout)
                    continue
                data = conn.take(size)
                size -= len(data)
                yield data
            if await conn.line(timeout, 2):
                raise httpx.RemoteProtocolError("chunk data longer than its size")

    async def _until_close(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.buffer:
                yield conn.take(len(conn.buffer))
            elif conn.eof:
                self._complete = True
                return
            else:
                try:
                    await conn.more(self._timeout)
                except httpx.RemoteProtocolError:
                    self._complete = True  # the end of the connection is the end of the body
                    return

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        # A body left unread (a reader that stopped early) makes the connection unusable;
        # so do extra bytes after the body.
        self._pool._release(conn, self._keep and self._complete and not conn.buffer)


class PinnedTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive, connecting only to each request's pinned address.

    ``ssl_context`` checks servers' certificates (the host name is checked, and
    sent as SNI); ``max_connections`` bounds connections open at once (a request
    waits up to the ``pool`` timeout for one); at most ``max_keepalive`` idle
    connections are kept, each for ``keepalive_expiry`` seconds.
    """

    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_keepalive: int | None = None,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
    ) -> None:
        self._ssl = ssl_context
        self.max_connections = max_connections
        self.max_keepalive = max_connections if max_keepalive is None else max_keepalive
        self.keepalive_expiry = keepalive_expiry
        self._idle: dict[tuple[str, str, int, str], list[_Connection]] = {}
        self._idle_count = 0
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def connections(self) -> tuple[int, int]:
        """(open, idle) connections, for tests and metrics."""
        return self._open, self._idle_count

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        target = request.extensions.get(PINNED)
        url = request.url
        if not isinstance(target, CheckedTarget):
            raise httpx.ConnectError(
                f"connection to {url.host} refused: the address was not checked by the guard",
                request=request,
            )
        default_port = 443 if url.scheme == "https" else 80
        host = url.raw_host.decode("ascii", errors="replace")  # IDNA form, as the guard's
        if (url.scheme, host, url.port or default_port) != (
            target.scheme,
            target.host,
            target.port,
        ):
            raise httpx.ConnectError(
                f"connection to {url.host}:{url.port or default_port} refused: the guard "
                f"checked {target.host}:{target.port}",
                request=request,
            )
        if request.method not in ("GET", "HEAD"):
            raise httpx.LocalProtocolError(f"{request.method} is not sent by this transport")
        head = _request_head(request)
        timeouts = request.extensions.get("timeout") or {}
        key = (target.scheme, target.host, target.port, target.address)
        for _attempt in range(2):
            conn = await self._acquire(key, target, timeouts)
            try:
                return await self._exchange(conn, request, head, timeouts.get("read"))
            except _Stale:
                self._release(conn, False)
                continue  # the server dropped a kept connection as we reused it: once more
            except BaseException:
                self._release(conn, False)
                raise
        raise httpx.RemoteProtocolError("the server closed the connection without answering")

    async def _exchange(
        self, conn: _Connection, request: httpx.Request, head: bytes, timeout: float | None
    ) -> httpx.Response:
        assert conn.transport is not None
        conn.transport.write(head)
        while True:  # 1xx interim answers are skipped
            status, reason, version, headers = await self._read_head(conn, timeout)
            if status >= 200:
                break
            if status == 101:
                raise httpx.RemoteProtocolError("the server switched protocols")
        framing, length, keep = _framing(request.method, status, version, headers)
        stream = _Body(self, conn, framing, length, keep, timeout)
        return httpx.Response(
            status,
            headers=headers,
            stream=stream,
            request=request,
            extensions={"http_version": version, "reason_phrase": reason},
        )

    async def _read_head(
        self, conn: _Connection, timeout: float | None
    ) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        buffer = conn.buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                raw = conn.take(end + 4)
                break
            end = buffer.find(b"\n\n")
            if end >= 0:
                raw = conn.take(end + 2)
                break
            if len(buffer) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("response head too large")
            if conn.eof:
                if conn.reused and not buffer:
                    raise _Stale()
                raise httpx.RemoteProtocolError("the server disconnected without a full answer")
            try:
                await conn.more(timeout)
            except httpx.RemoteProtocolError:
                if conn.reused and not buffer:
                    raise _Stale() from None
                raise
        lines = raw.split(b"\n")
        status_line = lines[0].rstrip(b"\r")
        parts = status_line.split(b" ", 2)
        version = parts[0]
        if not version.startswith(b"HTTP/1.") or len(parts) < 2 or len(parts[1]) != 3:
            raise httpx.RemoteProtocolError(f"bad status line {status_line[:60]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad status line {status_line[:60]!r}") from None
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            line = line.rstrip(b"\r")
            if not line:
                continue
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
                raise httpx.RemoteProtocolError(f"bad header line {line[:60]!r}")
            headers.append((name, value.strip(b" \t")))
        return status, parts[2] if len(parts) > 2 else b"", version, headers

    # -- the pool ---------------------------------------------------------------------------

    async def _acquire(
        self, key: tuple[str, str, int, str], target: CheckedTarget, timeouts: dict[str, Any]
    ) -> _Connection:
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise httpx.ConnectError("the transport is closed")
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                self._idle_count -= 1
                if conn.usable and loop.time() - conn.idle_since < self.keepalive_expiry:
                    conn.in_use = True
                    conn.reused = True
                    return conn
                self._drop(conn)
            if self._open < self.max_connections or self._evict_one():
                break
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken but leaving: pass the turn on
                else:
                    waiter.cancel()
                if isinstance(exc, TimeoutError):
                    raise httpx.PoolTimeout("no free connection within the pool timeout") from None
                raise
        self._open += 1
        try:
            return await self._connect(key, target, timeouts.get("connect"))
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def _connect(
        self, key: tuple[str, str, int, str], target: CheckedTarget, timeout: float | None
    ) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = target.scheme == "https"
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(key),
                    target.address,
                    target.port,
                    ssl=self._ssl if tls else None,
                    server_hostname=target.host if tls else None,
                    ssl_handshake_timeout=timeout if tls else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection within {timeout} s") from None
        except ssl.SSLError as exc:
            raise httpx.ConnectError(f"TLS failed: {exc.reason or exc}") from None
        except OSError as exc:
            # Not str(exc): asyncio's text names the address, the agent's DNS view.
            reason = os.strerror(exc.errno).lower() if exc.errno else "the connection failed"
            raise httpx.ConnectError(reason) from None
        return conn

    def _release(self, conn: _Connection, keep: bool) -> None:
        """A request is done with ``conn``: keep it for reuse, or close it."""
        if not conn.in_use:
            return
        conn.in_use = False
        if keep and conn.usable and not self._closed and self._idle_count < self.max_keepalive:
            conn.reused = False
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.setdefault(conn.key, []).append(conn)
            self._idle_count += 1
            self._wake_one()
            return
        self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1
        self._wake_one()

    def _evict_one(self) -> bool:
        """Close one idle connection (any host) to make room; False if none is idle."""
        for key, idle in self._idle.items():
            if idle:
                conn = idle.pop(0)  # the longest idle
                self._idle_count -= 1
                if not idle:
                    del self._idle[key]
                self._drop(conn)
                return True
        return False

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
                self._open -= 1
        self._idle.clear()
        self._idle_count = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


def _request_head(request: httpx.Request) -> bytes:
    """The request line and headers as bytes; refuses a body and header injection."""
    parts = [b"%s %s HTTP/1.1\r\n" % (request.method.encode("ascii"), request.url.raw_path)]
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered == b"content-length" or lowered == b"transfer-encoding":
            if value.strip() not in (b"0", b""):
                raise httpx.LocalProtocolError("request bodies are not sent by this transport")
            continue
        parts.append(b"%s: %s\r\n" % (name, value))
    parts.append(b"\r\n")
    head = b"".join(parts)
    # Every CR and LF must be one of the line ends put there above.
    lines = len(parts)
    if head.count(b"\n") != lines or head.count(b"\r") != lines or b"\x00" in head:
        raise httpx.LocalProtocolError("a header or the target holds a line break or NUL")
    return head


def _framing(
    method: str, status: int, version: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[str, int, bool]:
    """How the body is delimited: ("length", n, keep), ("chunked", 0, keep), ("close", 0, False)."""
    keep = version == b"HTTP/1.1"
    lengths: set[bytes] = set()
    coding = b""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-length":
            lengths.update(v.strip() for v in value.split(b","))
        elif lowered == b"transfer-encoding":
            coding = value
        elif lowered == b"connection" and b"close" in value.lower():
            keep = False
    if method == "HEAD" or status in _NO_BODY_STATUSES:
        return "length", 0, keep
    if coding:
        last = coding.split(b",")[-1].strip().lower()
        if last == b"chunked":
            # A Content-Length beside it is ignored, and the connection not trusted after.
            return "chunked", 0, keep and not lengths
        return "close", 0, False
    if lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise httpx.RemoteProtocolError("bad Content-Length in the response")
        return "length", int(next(iter(lengths))), keep
    return "close", 0, False
