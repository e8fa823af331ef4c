"""A lean HTTP/1.1 client pool that connects only to guard-checked addresses.

The fetcher's GETs go straight to :class:`PinnedPool`: no general-purpose client
sits in between. It was httpx (requests, responses, URLs, headers) over this
pool; ``bench/pagecheck.py``'s fetcher comparison (3,000 pages, 100 in flight,
one process, the same text extraction on both sides) decided it: that fetcher
checked 0.62–0.69× the pages per second of a bare aiohttp loop and spent about
0.50 ms of CPU per page to aiohttp's 0.25–0.37 ms, a third of it in httpx's
client layers and URL parsing. A request built from the guard's checked target
needs none of them; without them the fetcher spends 0.27–0.34 ms of CPU per
page to aiohttp's 0.30–0.33 ms in the same runs, and checked 0.59–1.19× its
pages per second (four runs beside other work, load 4–13 on 2 cores).
aiohttp was not taken instead: it can be given a resolver that runs the guard,
but it pools connections by host and port, not by the address checked, and the
guard, politeness and bounded decoding on top of it would leave it below itself.

Our own part is the pool, the pinning and the request head below; responses are
parsed by llhttp (Node.js's parser, fuzzed upstream) through httptools, as each
piece arrives. It speaks the part of HTTP/1.1 a page checker needs: ``GET``
without a request body; responses framed by ``Content-Length``, ``chunked``
transfer coding or the end of the connection; keep-alive connections reused per
host; TLS with the host name as server name (SNI) and for the certificate check.
llhttp is strict: a response with two ``Content-Length`` headers, both a length
and ``chunked``, a folded (obs-fold) header or bare LF line ends is refused, and
the connection dropped.

**Pinning.** A request is made from the
:class:`~crawler_app.fetching.guard.CheckedTarget` the SSRF guard returned for its
URL, and nothing else: the pool connects to exactly its checked address, sends
its host name in ``Host`` (and as the TLS server name) and its path and query as
the request target, and refuses anything but a checked target. Connections are
pooled by scheme, host name, port *and* address, so a kept connection is never
reused for another host name or for an address the guard did not check this time.

:class:`Timeouts` bound each request: ``connect`` (TCP and TLS), ``read`` (longest
wait for a byte from the server) and ``pool`` (longest wait for a free
connection). Bodies are streamed to the reader, who enforces its own size limit
by stopping early; the pool never buffers more than :data:`HIGH_WATER` bytes
ahead of the reader. Failures are :class:`TransportError`, with a code the
fetcher reports.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import httptools
import httpx

from .guard import CheckedTarget

#: Connections open at once (in use and idle), all hosts together.
MAX_CONNECTIONS = 100
#: Seconds an idle connection is kept for reuse.
KEEPALIVE_EXPIRY = 5.0
#: Longest response head (status line and headers) read, in bytes.
MAX_HEAD_BYTES = 64 * 1024
#: Bytes buffered ahead of the reader before the socket stops being read.
HIGH_WATER = 256 * 1024
#: Most header lines in a response head.
MAX_HEADERS = 200
#: Interim (1xx) answers skipped before a final one; more is a broken (or hostile) server.
MAX_INTERIM = 10

_NO_BODY_STATUSES = frozenset({204, 304})


class Timeouts(NamedTuple):
    """Seconds a request may wait (None: no limit): see the module doc."""

    connect: float | None
    read: float | None
    pool: float | None


class TransportError(Exception):
    """A request that failed: ``code`` is ``timeout``, ``connect_error`` or
    ``protocol_error``; ``detail`` says what happened, in one line."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class _Stale(Exception):
    """A reused connection closed before the server answered: safe to retry once."""


class _Response:
    """One response as llhttp (httptools) parses it: the parser's callbacks fill it.

    Fed from the connection's ``data_received``; the request coroutine reads the
    head, then the body pieces, from here. Interim (1xx) answers are skipped,
    at most :data:`MAX_INTERIM` of them.
    """

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False  # the final (2xx-5xx) head is parsed
        self.head_bytes = 0  # bytes fed before the final head was done
        self.head_size = 0  # bytes of status lines and headers parsed
        self.interim = 0
        self.body: deque[bytes] = deque()
        self.buffered = 0  # bytes in ``body``
        self.complete = False
        self.keep = False  # the server lets the connection be reused
        self.close_delimited = False  # no length nor chunked coding: the end is the close
        self.extra = False  # bytes after the response: the connection cannot be reused
        self.error: str | None = None

    # -- httptools callbacks (an exception raised here fails feed_data) -----------------------

    def on_message_begin(self) -> None:
        if self.head_done:
            self.extra = True
        self.headers = []

    def on_status(self, reason: bytes) -> None:
        if not self.head_done:
            self._count(len(reason))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # trailers (after a chunked body) are ignored
        self.headers.append((bytes(name), bytes(value)))
        self._count(len(name) + len(value))
        if len(self.headers) > MAX_HEADERS:
            raise self._fail(f"more than {MAX_HEADERS} header lines")

    def on_headers_complete(self) -> None:
        parser = self.parser
        status = parser.get_status_code()
        if status < 200:
            self.interim += 1
            if self.interim > MAX_INTERIM:
                raise self._fail(f"more than {MAX_INTERIM} interim (1xx) answers")
            return
        self.status = status
        self.keep = parser.should_keep_alive()
        self.head_done = True
        framed = any(
            name.lower() == b"content-length"
            or (name.lower() == b"transfer-encoding" and b"chunked" in value.lower())
            for name, value in self.headers
        )
        self.close_delimited = not framed and status not in _NO_BODY_STATUSES

    def on_body(self, body: bytes) -> None:
        if self.complete:
            self.extra = True
            return
        self.body.append(bytes(body))
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True

    def _count(self, size: int) -> None:
        # Bytes fed are counted too (see feed), but a head that arrives whole with its
        # body in one piece is only measured here.
        self.head_size += size + 4
        if self.head_size > MAX_HEAD_BYTES:
            raise self._fail("response head too large")

    def _fail(self, message: str) -> Exception:
        self.error = message
        return TransportError("protocol_error", message)

    # -- fed by the connection -------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Parse ``data``; a broken answer sets :attr:`error` (or :attr:`extra`, after the end)."""
        if self.error is not None or (self.complete and self.extra):
            return
        if not self.head_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken("the server switched protocols")
        except httptools.HttpParserError as exc:
            self._broken(self.error or str(exc).strip() or type(exc).__name__)
        if not self.head_done and self.head_bytes > MAX_HEAD_BYTES and self.error is None:
            self.error = "response head too large"

    def _broken(self, message: str) -> None:
        if self.complete:
            self.extra = True  # the answer was whole; what came after is not trusted
        elif self.error is None:
            self.error = message[:200]

    def closed(self) -> None:
        """The server closed the connection."""
        if self.complete or self.error is not None:
            return
        if self.head_done and self.close_delimited:
            self.complete, self.keep = True, False
        else:
            self.error = "the server closed the connection mid-response"


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; the response in progress is parsed as bytes arrive."""

    def __init__(self, key: tuple[str, str, int, str]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.response: _Response | None = None
        self.received = False  # any byte of the current response arrived
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
        response = self.response
        if not self.in_use or response is None:
            self.eof = True  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        self.received = True
        response.feed(data)
        if response.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._closed_by_peer()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed_by_peer()

    def _closed_by_peer(self) -> None:
        self.eof = True
        if self.response is not None:
            self.response.closed()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- used by the request coroutine ----------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self.eof and self.transport is not None and not self.transport.is_closing()

    def begin(self) -> _Response:
        self.response = _Response()
        self.received = False
        return self.response

    async def wait(self, timeout: float | None) -> None:
        """Wait until something happens on the connection; a timeout error after ``timeout``."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def take(self) -> bytes:
        """The next body piece the parser produced (the caller checked there is one)."""
        response = self.response
        assert response is not None
        piece = response.body.popleft()
        response.buffered -= len(piece)
        if self._paused and response.buffered <= HIGH_WATER and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return piece

    def close(self) -> None:
        self.eof = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(
            TransportError("timeout", "no data from the server within the read timeout")
        )


class Reply:
    """One answer: ``status``, ``headers`` (lower-case names, repeated ones joined
    with ", "), and the body, read with :meth:`piece`. :meth:`close` it when done."""

    __slots__ = ("status", "headers", "_pool", "_conn", "_response", "_timeout", "_closed")

    def __init__(
        self, pool: PinnedPool, conn: _Connection, response: _Response, timeout: float | None
    ) -> None:
        self.status = response.status
        headers: dict[str, str] = {}
        for raw_name, raw_value in response.headers:
            name = raw_name.decode("latin-1").lower()
            try:
                value = raw_value.decode("utf-8")
            except UnicodeDecodeError:
                value = raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.headers = headers
        self._pool = pool
        self._conn = conn
        self._response = response
        self._timeout = timeout
        self._closed = False

    async def piece(self) -> bytes:
        """The body's next bytes as they arrive, undecoded (``Content-Encoding`` is the
        reader's); ``b""`` at its end."""
        conn, response = self._conn, self._response
        while not self._closed:
            if response.body:
                return conn.take()
            if response.error is not None:
                raise TransportError("protocol_error", response.error)
            if response.complete:
                break
            await conn.wait(self._timeout)
        return b""

    def close(self) -> None:
        """Give the connection back: kept for reuse if the answer was read whole and clean."""
        if self._closed:
            return
        self._closed = True
        response = self._response
        # A body left unread (a reader that stopped early) makes the connection unusable;
        # so do bytes after the body.
        keep = response.keep and response.complete and not response.body and not response.extra
        self._pool._release(self._conn, keep and response.error is None)


class PinnedPool:
    """HTTP/1.1 GETs with keep-alive, connecting only to each request's checked address.

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

    async def get(
        self, target: CheckedTarget, headers: Sequence[tuple[str, str]], timeouts: Timeouts
    ) -> Reply:
        """``GET`` ``target`` from its checked address with ``headers`` (after ``Host``).

        The reply's head has arrived; its body is read from the :class:`Reply`.
        Raises :class:`TransportError`.
        """
        if not isinstance(target, CheckedTarget) or not target.address:
            host = getattr(target, "host", target)
            raise TransportError(
                "connect_error",
                f"connection to {host} refused: the address was not checked by the guard",
            )
        head = _request_head(target, headers)
        key = (target.scheme, target.host, target.port, target.address)
        for _attempt in range(2):
            conn = await self._acquire(key, target, timeouts)
            try:
                return await self._exchange(conn, head, timeouts.read)
            except _Stale:
                self._release(conn, False)
                continue  # the server dropped a kept connection as we reused it: once more
            except BaseException:
                self._release(conn, False)
                raise
        raise TransportError("protocol_error", "the server closed the connection without answering")

    async def _exchange(self, conn: _Connection, head: bytes, timeout: float | None) -> Reply:
        assert conn.transport is not None
        response = conn.begin()
        conn.transport.write(head)
        while not response.head_done:
            if response.error is not None:
                if conn.reused and not conn.received:
                    raise _Stale()
                raise TransportError("protocol_error", response.error)
            if conn.eof:
                if conn.reused and not conn.received:
                    raise _Stale()
                raise TransportError(
                    "protocol_error", "the server disconnected without a full answer"
                )
            await conn.wait(timeout)
        return Reply(self, conn, response, timeout)

    # -- the pool ---------------------------------------------------------------------------

    async def _acquire(
        self, key: tuple[str, str, int, str], target: CheckedTarget, timeouts: Timeouts
    ) -> _Connection:
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise TransportError("connect_error", "the connection pool is closed")
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
                async with asyncio.timeout(timeouts.pool):
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken but leaving: pass the turn on
                else:
                    waiter.cancel()
                if isinstance(exc, TimeoutError):
                    raise TransportError(
                        "timeout", "no free connection within the pool timeout"
                    ) from None
                raise
        self._open += 1
        try:
            return await self._connect(key, target, timeouts.connect)
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
            raise TransportError("timeout", f"no connection within {timeout} s") from None
        except ssl.SSLError as exc:
            raise TransportError("connect_error", f"TLS failed: {exc.reason or exc}") from None
        except OSError as exc:
            # Not str(exc): asyncio's text names the address, the agent's DNS view.
            reason = os.strerror(exc.errno).lower() if exc.errno else "the connection failed"
            raise TransportError("connect_error", reason) from None
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

    async def __aenter__(self) -> PinnedPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


# A path and query sent as they are: characters no URL parser percent-encodes, and
# escapes already made. Anything else (non-ASCII, quotes, dot segments, ...) is put
# in the form httpx sends; whichever way, the target is the one the guard checked.
_PLAIN_TARGET = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*")


def _request_target(target: CheckedTarget) -> str:
    path = target.target.partition("?")[0]
    if _PLAIN_TARGET.fullmatch(target.target) and "/." not in path:
        return target.target
    return httpx.URL(target.url).raw_path.decode("ascii")


def _request_head(target: CheckedTarget, headers: Sequence[tuple[str, str]]) -> bytes:
    """The request line and headers as bytes; refuses header injection."""
    lines = [f"GET {_request_target(target)} HTTP/1.1", f"Host: {target.netloc}"]
    lines += [f"{name}: {value}" for name, value in headers]
    head = "\r\n".join(lines)
    # Every CR and LF must be one of the line ends put there above.
    if head.count("\n") != len(lines) - 1 or head.count("\r") != len(lines) - 1 or "\0" in head:
        raise TransportError("protocol_error", "a header or the target holds a line break or NUL")
    return (head + "\r\n\r\n").encode("utf-8")
