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

Our own part is the pool, the pinning and the request head below, and the
connection (:mod:`crawler_app.fetching.connection`), whose llhttp parser
(httptools) reads each answer as it arrives. It speaks the part of HTTP/1.1 a
page checker needs: ``GET`` without a request body; responses framed by
``Content-Length``, ``chunked`` transfer coding or the end of the connection;
keep-alive connections reused per host; TLS with the host name as server name
(SNI) and for the certificate check. A broken answer drops its connection.

Per page, the request path allocates little and waits once: the head and a small
body arrive together, and are read without another wait; one timer bounds the
wait, the nearer of the read timeout and the caller's deadline (the fetcher's
total time left), rather than an ``asyncio.timeout`` as well; no parser nor
answer object is made per request (see the connection module), and pools share
one TLS context. Measured with the bench's fetcher comparison (``--fetchers-only``:
5,000 pages, 100 in flight, the least CPU of five rounds, three runs of each
interleaved, load 3–4 on 2 cores): 0.31–0.35 ms of CPU per page against
0.40–0.51 ms before, with aiohttp at 0.39–0.55 ms in the same runs.

**Pinning.** A request is made from the
:class:`~crawler_app.fetching.guard.CheckedTarget` the SSRF guard returned for its
URL, and nothing else: the pool connects to exactly its checked address, sends
its host name in ``Host`` (and as the TLS server name) and its path and query as
the request target, and refuses anything but a checked target. Connections are
pooled by scheme, host name, port *and* address, so a kept connection is never
reused for another host name or for an address the guard did not check this time.

:class:`Timeouts` bound each request: ``connect`` (TCP and TLS), ``read`` (longest
wait for a byte from the server) and ``pool`` (longest wait for a free
connection); a ``deadline`` given to :meth:`PinnedPool.get` bounds them all.
Bodies are streamed to the reader, who enforces its own size limit by stopping
early; the pool never buffers more than
:data:`~crawler_app.fetching.connection.HIGH_WATER` bytes ahead of the reader.
Failures are :class:`TransportError`, with a code the fetcher reports.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import httpx

from .connection import DEADLINE_PASSED, HttpConnection, TransportError, bounded
from .guard import CheckedTarget

__all__ = [
    "KEEPALIVE_EXPIRY",
    "MAX_CONNECTIONS",
    "PinnedPool",
    "Reply",
    "Timeouts",
    "TransportError",
]

#: Connections open at once (in use and idle), all hosts together.
MAX_CONNECTIONS = 100
#: Seconds an idle connection is kept for reuse.
KEEPALIVE_EXPIRY = 5.0

_Key = tuple[str, str, int, str]  # scheme, host name, port, checked address


class Timeouts(NamedTuple):
    """Seconds a request may wait (None: no limit): see the module doc."""

    connect: float | None
    read: float | None
    pool: float | None


class _Stale(Exception):
    """A reused connection closed before the server answered: safe to retry once."""


class Reply:
    """One answer: ``status``, ``headers`` (lower-case names, repeated ones joined
    with ", "), and the body, read with :meth:`piece`. :meth:`close` it when done."""

    __slots__ = ("status", "headers", "_pool", "_conn", "_timeout", "_deadline", "_closed")

    def __init__(
        self,
        pool: PinnedPool,
        conn: HttpConnection,
        timeout: float | None,
        deadline: float | None,
    ) -> None:
        self.status = conn.status
        headers: dict[str, str] = {}
        for raw_name, raw_value in conn.headers:
            name = raw_name.decode("latin-1").lower()
            try:
                value = raw_value.decode("utf-8")
            except UnicodeDecodeError:
                value = raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.headers = headers
        self._pool = pool
        self._conn = conn
        self._timeout = timeout
        self._deadline = deadline
        self._closed = False

    async def piece(self) -> bytes:
        """The body's next bytes as they arrive, undecoded (``Content-Encoding`` is the
        reader's); ``b""`` at its end."""
        while (piece := self.ready()) is None:
            await self._conn.wait(self._timeout, self._deadline)
        return piece

    def ready(self) -> bytes | None:
        """What :meth:`piece` would give without waiting, or None if it would wait.

        A small body has mostly arrived with the head: reading it so costs no
        coroutine per piece."""
        conn = self._conn
        if self._closed:
            return b""
        if conn.body:
            return conn.take()
        if conn.error is not None:
            raise TransportError("protocol_error", conn.error)
        if conn.complete:
            return b""
        return None

    def close(self) -> None:
        """Give the connection back: kept for reuse if the answer was read whole and clean."""
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        # A body left unread (a reader that stopped early) makes the connection unusable;
        # so do bytes after the body.
        keep = conn.keep and conn.complete and not conn.body and not conn.extra
        self._pool._release(conn, keep and conn.error is None)


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
        self._idle: dict[_Key, list[HttpConnection]] = {}
        self._idle_count = 0
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def connections(self) -> tuple[int, int]:
        """(open, idle) connections, for tests and metrics."""
        return self._open, self._idle_count

    async def get(
        self,
        target: CheckedTarget,
        headers: Sequence[tuple[str, str]],
        timeouts: Timeouts,
        deadline: float | None = None,
    ) -> Reply:
        """``GET`` ``target`` from its checked address with ``headers`` (after ``Host``).

        The reply's head has arrived; its body is read from the :class:`Reply`.
        ``deadline`` (the event loop's time) bounds every wait of the request, its
        body's included, besides ``timeouts``; a wait it cuts short fails with a
        :class:`TransportError` whose ``deadline`` is True. Raises :class:`TransportError`.
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
            conn = self._take_idle(key)
            if conn is None:
                conn = await self._acquire(key, target, timeouts, deadline)
            try:
                return await self._exchange(conn, head, timeouts.read, deadline)
            except _Stale:
                self._release(conn, False)
                continue  # the server dropped a kept connection as we reused it: once more
            except BaseException:
                self._release(conn, False)
                raise
        raise TransportError("protocol_error", "the server closed the connection without answering")

    async def _exchange(
        self, conn: HttpConnection, head: bytes, timeout: float | None, deadline: float | None
    ) -> Reply:
        assert conn.transport is not None
        conn.begin()
        conn.transport.write(head)
        while not conn.head_done:
            if conn.error is not None:
                if conn.reused and not conn.received:
                    raise _Stale()
                raise TransportError("protocol_error", conn.error)
            if conn.eof:
                if conn.reused and not conn.received:
                    raise _Stale()
                raise TransportError(
                    "protocol_error", "the server disconnected without a full answer"
                )
            await conn.wait(timeout, deadline)
        return Reply(self, conn, timeout, deadline)

    # -- the pool ---------------------------------------------------------------------------

    def _take_idle(self, key: _Key) -> HttpConnection | None:
        """A kept connection for ``key`` still fit for use, or None."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if conn.usable and conn.loop.time() - conn.idle_since < self.keepalive_expiry:
                conn.in_use = True
                conn.reused = True
                return conn
            self._drop(conn)
        return None

    async def _acquire(
        self, key: _Key, target: CheckedTarget, timeouts: Timeouts, deadline: float | None
    ) -> HttpConnection:
        """A connection for ``key``: a kept one, or a new one once the pool has room."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise TransportError("connect_error", "the connection pool is closed")
            conn = self._take_idle(key)
            if conn is not None:
                return conn
            if self._open < self.max_connections or self._evict_one():
                break
            waiter = loop.create_future()
            self._waiters.append(waiter)
            timeout, by_deadline = bounded(timeouts.pool, deadline, loop)
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken but leaving: pass the turn on
                else:
                    waiter.cancel()
                if isinstance(exc, TimeoutError):
                    if by_deadline:
                        raise TransportError("timeout", DEADLINE_PASSED, deadline=True) from None
                    raise TransportError(
                        "timeout", "no free connection within the pool timeout"
                    ) from None
                raise
        self._open += 1
        try:
            return await self._connect(key, target, timeouts.connect, deadline)
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def _connect(
        self, key: _Key, target: CheckedTarget, timeout: float | None, deadline: float | None
    ) -> HttpConnection:
        loop = asyncio.get_running_loop()
        timeout, by_deadline = bounded(timeout, deadline, loop)
        tls = target.scheme == "https"
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: HttpConnection(key, loop),
                    target.address,
                    target.port,
                    ssl=self._ssl if tls else None,
                    server_hostname=target.host if tls else None,
                    ssl_handshake_timeout=(timeout or None) if tls else None,
                )
        except TimeoutError:
            if by_deadline:
                raise TransportError("timeout", DEADLINE_PASSED, deadline=True) from None
            raise TransportError("timeout", f"no connection within {timeout} s") from None
        except ssl.SSLError as exc:
            raise TransportError("connect_error", f"TLS failed: {exc.reason or exc}") from None
        except OSError as exc:
            # Not str(exc): asyncio's text names the address, the agent's DNS view.
            reason = os.strerror(exc.errno).lower() if exc.errno else "the connection failed"
            raise TransportError("connect_error", reason) from None
        return conn

    def _release(self, conn: HttpConnection, keep: bool) -> None:
        """A request is done with ``conn``: keep it for reuse, or close it."""
        if not conn.in_use:
            return
        conn.in_use = False
        if keep and conn.usable and not self._closed and self._idle_count < self.max_keepalive:
            conn.reused = False
            conn.idle_since = conn.loop.time()
            self._idle.setdefault(conn.key, []).append(conn)
            self._idle_count += 1
            self._wake_one()
            return
        self._drop(conn)

    def _drop(self, conn: HttpConnection) -> None:
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
