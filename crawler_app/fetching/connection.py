"""One connection of the pinned pool, and the answer being read on it.

An HTTP/1.1 connection carries one answer at a time, so the answer in progress
is state of its :class:`HttpConnection`: :meth:`HttpConnection.begin` resets it
for the next request, and one llhttp parser (Node.js's parser, fuzzed upstream,
through httptools) reads every answer of the connection as each piece arrives,
as llhttp is meant to. A request so allocates neither a parser nor a state
object, and leaves nothing for the cycle collector: the parser and the
connection refer to each other, and the connection lets go of its parser when it
closes. A parser and an answer object per request left 13 objects a page in
reference cycles, which made the collector run more than twice as often
(``bench/pagecheck.py``'s fetcher comparison, see
:mod:`crawler_app.fetching.transport`); reading a page's answer took 12–14 µs
that way, 2.5–3 µs this way, the collector's share included.

llhttp is strict: a response with two ``Content-Length`` headers, both a length
and ``chunked``, a folded (obs-fold) header or bare LF line ends is refused. On
top of it the head is bounded (:data:`MAX_HEAD_BYTES`, :data:`MAX_HEADERS`,
:data:`MAX_INTERIM`) and the body buffered ahead of the reader is bounded
(:data:`HIGH_WATER`: the socket stops being read past it).
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools

#: Longest response head (status line and headers) read, in bytes.
MAX_HEAD_BYTES = 64 * 1024
#: Bytes buffered ahead of the reader before the socket stops being read.
HIGH_WATER = 256 * 1024
#: Most header lines in a response head.
MAX_HEADERS = 200
#: Interim (1xx) answers skipped before a final one; more is a broken (or hostile) server.
MAX_INTERIM = 10

_NO_BODY_STATUSES = frozenset({204, 304})
#: A timeout's detail when the request's deadline, not one of the pool's timeouts, ran out.
DEADLINE_PASSED = "the request's deadline passed"


class TransportError(Exception):
    """A request that failed: ``code`` is ``timeout``, ``connect_error`` or
    ``protocol_error``; ``detail`` says what happened, in one line. ``deadline``
    is True for a timeout that came from the request's deadline rather than from
    one of the pool's own timeouts."""

    def __init__(self, code: str, detail: str, *, deadline: bool = False) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.deadline = deadline


def bounded(
    timeout: float | None, deadline: float | None, loop: asyncio.AbstractEventLoop
) -> tuple[float | None, bool]:
    """The wait allowed by ``timeout`` and ``deadline`` (loop time), and whether the
    deadline is the nearer bound."""
    if deadline is None:
        return timeout, False
    left = max(0.0, deadline - loop.time())
    if timeout is None or left < timeout:
        return left, True
    return timeout, False


class HttpConnection(asyncio.Protocol):
    """One TCP (or TLS) connection to a checked address, and its answer in progress.

    ``key`` is the pool's key (scheme, host, port, address). The answer's state
    (``status``, raw ``headers``, ``body`` pieces not yet taken, ``complete``,
    ``keep``, ``error`` ...) is filled by the parser's callbacks and read by the
    request coroutine, which waits for news with :meth:`wait`.
    """

    __slots__ = (
        "key", "loop", "transport", "parser", "in_use", "reused", "idle_since", "eof",
        "_waiter", "_paused",
        # The answer in progress, reset by begin().
        "received", "status", "headers", "head_done", "head_bytes", "head_size", "interim",
        "body", "buffered", "complete", "keep", "extra", "error",
    )  # fmt: skip

    def __init__(self, key: tuple[str, str, int, str], loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.in_use = True
        self.reused = False
        self.idle_since = 0.0
        self.eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.body: deque[bytes] = deque()
        self.begin()

    def begin(self) -> None:
        """Forget the last answer: a request is about to be sent."""
        self.received = False  # any byte of this answer arrived
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False  # the final (2xx-5xx) head is parsed
        self.head_bytes = 0  # bytes fed before the final head was done
        self.head_size = 0  # bytes of status lines and headers parsed
        self.interim = 0
        self.body.clear()  # a connection is only kept once its body was taken whole
        self.buffered = 0  # bytes in ``body``
        self.complete = False
        self.keep = False  # the server lets the connection be reused
        self.extra = False  # bytes after the answer: the connection cannot be reused
        self.error: str | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if not self.in_use or parser is None:
            self.close()  # bytes nobody asked for: the connection cannot be trusted
            return
        self.received = True
        if self.error is None and not (self.complete and self.extra):
            if not self.head_done:
                self.head_bytes += len(data)
            try:
                parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._broken("the server switched protocols")
            except httptools.HttpParserError as exc:
                self._broken(self.error or str(exc).strip() or type(exc).__name__)
            if not self.head_done and self.head_bytes > MAX_HEAD_BYTES and self.error is None:
                self.error = "response head too large"
        if self.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._closed_by_peer()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed_by_peer()
        self.parser = None  # the parser refers back to this connection: no cycle left

    # -- httptools callbacks (an exception raised here fails feed_data) -----------------

    def on_message_begin(self) -> None:
        if self.head_done:
            self.extra = True
        self.headers = []  # an interim answer's headers are dropped

    def on_status(self, reason: bytes) -> None:
        if not self.head_done:
            self.head_size += len(reason) + 4
            if self.head_size > MAX_HEAD_BYTES:
                raise self._fail("response head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # trailers (after a chunked body) are ignored
        headers = self.headers
        headers.append((name, value))
        # Bytes fed are counted too (see data_received), but a head that arrives whole
        # with its body in one piece is only measured here.
        self.head_size += len(name) + len(value) + 4
        if self.head_size > MAX_HEAD_BYTES:
            raise self._fail("response head too large")
        if len(headers) > MAX_HEADERS:
            raise self._fail(f"more than {MAX_HEADERS} header lines")

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None
        status = parser.get_status_code()
        if status < 200:
            self.interim += 1
            if self.interim > MAX_INTERIM:
                raise self._fail(f"more than {MAX_INTERIM} interim (1xx) answers")
            return
        self.status = status
        self.keep = parser.should_keep_alive()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        if self.complete:
            self.extra = True
            return
        self.body.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True

    def _fail(self, message: str) -> Exception:
        self.error = message
        return TransportError("protocol_error", message)

    def _broken(self, message: str) -> None:
        if self.complete:
            self.extra = True  # the answer was whole; what came after is not trusted
        elif self.error is None:
            self.error = message[:200]

    def _closed_by_peer(self) -> None:
        self.eof = True
        if not self.complete and self.error is None:
            if self.head_done and self._close_delimited():
                self.complete, self.keep = True, False
            elif self.in_use:
                self.error = "the server closed the connection mid-response"
        self._wake()

    def _close_delimited(self) -> bool:
        """True if the answer has no length nor chunked coding: its end is the close."""
        if self.status in _NO_BODY_STATUSES:
            return False
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"content-length":
                return False
            if lower == b"transfer-encoding" and b"chunked" in value.lower():
                return False
        return True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- used by the request coroutine ----------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self.eof and self.transport is not None and not self.transport.is_closing()

    async def wait(self, timeout: float | None, deadline: float | None) -> None:
        """Wait until something happens on the connection, at most ``timeout`` seconds
        and not past ``deadline`` (loop time); then a :class:`TransportError`."""
        loop = self.loop
        delay, by_deadline = bounded(timeout, deadline, loop)
        waiter = self._waiter = loop.create_future()
        timer = None
        if delay is not None:
            timer = loop.call_later(delay, _expire, waiter, by_deadline)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def take(self) -> bytes:
        """The next body piece the parser produced (the caller checked there is one)."""
        piece = self.body.popleft()
        self.buffered -= len(piece)
        if self._paused and self.buffered <= HIGH_WATER and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return piece

    def close(self) -> None:
        self.eof = True
        self.parser = None
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None], by_deadline: bool) -> None:
    if not waiter.done():
        if by_deadline:
            error = TransportError("timeout", DEADLINE_PASSED, deadline=True)
        else:
            error = TransportError("timeout", "no data from the server within the read timeout")
        waiter.set_exception(error)
