"""A local HTTP site whose pages the test controls, for tests of the page checker.

A threaded HTTP/1.1 server on 127.0.0.1 (or another loopback address) and a
free port. Each path serves what the test set: body, status, headers, latency,
a slow (dripping) or huge body, or what a function makes for each request;
ETag / Last-Modified validators are honoured with ``304 Not Modified``. Every
request is logged per path (method, headers, status, whether a body was sent,
how many body bytes went out, start and end times), so a test can assert what
the server saw.

Use the fixtures by naming this module as a plugin in the test module (import
``TestSite`` for annotations only, under ``TYPE_CHECKING``, so pytest can
rewrite this module's asserts)::

    pytest_plugins = ("tests.site",)

    def test_example(site, make_site):
        site.set_page("/a", body="<p>hello</p>", headers={"ETag": '"v1"'})
        result = asyncio.run(fetch(site.url("/a"), settings=...))
        assert site.requests("/a")[0].body_sent
        other = make_site("127.0.0.2")  # a second host, stopped after the test

``site`` is a started :class:`TestSite` on 127.0.0.1; ``make_site`` starts more.
The class works without pytest too: ``with TestSite("127.0.0.2") as s: ...``.
``TestSite(tls=(certfile, keyfile))`` serves HTTPS and logs the TLS server
name (SNI) each client asked for.
"""

from __future__ import annotations

import email.utils
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest

#: Bytes written per chunk when a body is sent in pieces.
CHUNK = 16 * 1024


@dataclass
class Page:
    """What one path serves. See :meth:`TestSite.set_page`."""

    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drip: float = 0.0
    size: int | None = None
    send_length: bool = True


@dataclass(frozen=True)
class Request:
    """One request as the server saw it. Header names are lower case."""

    method: str
    target: str
    headers: dict[str, str]
    status: int
    body_sent: bool
    bytes_sent: int
    started: float  # time.monotonic() when the request head was read
    finished: float  # time.monotonic() when the answer was written (or failed)
    sni: str | None = None  # TLS server name the client sent (HTTPS sites only)
    header_names: tuple[str, ...] = ()  # every header line's name, in order, as sent

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass  # keep test output clean

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.server.site._serve(self)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server naming
        self.server.site._serve(self)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 drops connections when many arrive at once
    site: TestSite


def _page(
    body: str | bytes = "",
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    content_type: str | None = "text/html; charset=utf-8",
    delay: float = 0.0,
    drip: float = 0.0,
    size: int | None = None,
    send_length: bool = True,
) -> Page:
    all_headers = dict(headers or {})
    if content_type is not None:
        all_headers.setdefault("Content-Type", content_type)
    data = body.encode("utf-8") if isinstance(body, str) else body
    return Page(data, status, all_headers, delay, drip, size, send_length)


@dataclass
class _Maker:
    make: Callable[[int, dict[str, str]], Mapping[str, Any]]
    count: int = 0


def _not_modified(page: Page, request_headers: Mapping[str, str]) -> bool:
    etag = page.headers.get("ETag")
    if_none_match = request_headers.get("if-none-match")
    if if_none_match is not None:
        if etag is None:
            return False
        tags = [t.strip() for t in if_none_match.split(",")]
        return "*" in tags or etag in tags
    last_modified = page.headers.get("Last-Modified")
    since = request_headers.get("if-modified-since")
    if since is None or last_modified is None:
        return False
    if since == last_modified:
        return True
    try:
        return email.utils.parsedate_to_datetime(
            last_modified
        ) <= email.utils.parsedate_to_datetime(since)
    except (TypeError, ValueError):
        return False


def _remember_sni(
    connection: ssl.SSLSocket | ssl.SSLObject, server_name: str | None, context: ssl.SSLContext
) -> None:
    connection.sni = server_name  # type: ignore[union-attr]


class TestSite:
    """The controllable local HTTP site (see the module doc)."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, host: str = "127.0.0.1", *, tls: tuple[str, str] | None = None) -> None:
        self.host = host
        self.tls = tls
        self.port = 0
        self._pages: dict[str, Page] = {}
        self._makers: dict[str, _Maker] = {}
        self._log: list[Request] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- life cycle ---

    def start(self) -> TestSite:
        """Listen on a free port and serve in a background thread."""
        server = _Server((self.host, 0), _Handler)
        server.site = self
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            context.sni_callback = _remember_sni
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; wakes requests that are waiting out a delay."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> TestSite:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- what the site serves ---

    @property
    def base_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def url(self, path: str = "/") -> str:
        """Absolute URL of ``path`` on this site."""
        return f"{self.base_url}{path}"

    def set_page(
        self,
        path: str,
        body: str | bytes = "",
        *,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = "text/html; charset=utf-8",
        delay: float = 0.0,
        drip: float = 0.0,
        size: int | None = None,
        send_length: bool = True,
    ) -> None:
        """Serve ``body`` at ``path`` (replacing what was there).

        ``headers`` are sent as given (an ``ETag``/``Last-Modified`` here makes
        conditional requests answer 304); ``content_type`` None sends none;
        ``delay`` waits before the status line; ``drip`` waits between body
        chunks; ``size`` streams that many filler bytes instead of ``body``;
        ``send_length=False`` omits Content-Length and closes the connection
        after the body.
        """
        page = _page(body, status, headers, content_type, delay, drip, size, send_length)
        with self._lock:
            self._makers.pop(path, None)
            self._pages[path] = page

    def set_maker(
        self, path: str, maker: Callable[[int, dict[str, str]], Mapping[str, Any]]
    ) -> None:
        """Serve at ``path`` what ``maker(n, headers)`` says for the n-th request to it.

        ``n`` counts from 0; ``headers`` are the request's (names in lower case).

        ``maker`` returns :meth:`set_page`'s keyword arguments (``body``, ``status``,
        ``headers`` ...); it is called once per request, in the handler's thread, so
        a page can differ on every request (a clock, a random banner).
        """
        with self._lock:
            self._pages.pop(path, None)
            self._makers[path] = _Maker(maker)

    def set_redirect(self, path: str, location: str, status: int = 302) -> None:
        """Answer ``path`` with a redirect to ``location`` (any string, sent as is)."""
        self.set_page(path, status=status, headers={"Location": location}, content_type=None)

    def set_robots(self, text: str) -> None:
        """Serve ``text`` as /robots.txt."""
        self.set_page("/robots.txt", text, content_type="text/plain")

    def remove_page(self, path: str) -> None:
        """Answer ``path`` with 404 again."""
        with self._lock:
            self._pages.pop(path, None)
            self._makers.pop(path, None)

    # --- what the site saw ---

    def requests(self, path: str | None = None) -> list[Request]:
        """Requests logged for ``path`` (query ignored), or all, in arrival order.

        A request is logged once its answer is written: right after a fetch, use
        :meth:`wait_requests` to count it.
        """
        with self._lock:
            records = list(self._log)
        records.sort(key=lambda r: r.started)
        return [r for r in records if path is None or r.path == path]

    def wait_requests(
        self, path: str | None = None, count: int = 1, timeout: float = 5.0
    ) -> list[Request]:
        """:meth:`requests` once at least ``count`` are logged (a request is logged
        after its answer is written, which may be just after the client has it)."""
        self.wait_for(lambda: len(self.requests(path)) >= count, timeout)
        return self.requests(path)

    def wait_for(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Poll ``condition`` until true; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout} s")
            time.sleep(0.01)

    @staticmethod
    def max_overlap(records: list[Request]) -> int:
        """Largest number of the given requests being handled at one moment."""
        events = sorted([(r.started, 1) for r in records] + [(r.finished, -1) for r in records])
        best = current = 0
        for _, step in events:
            current += step
            best = max(best, current)
        return best

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    # --- serving (handler threads) ---

    def _serve(self, handler: _Handler) -> None:
        started = time.monotonic()
        request_headers = {k.lower(): v for k, v in handler.headers.items()}
        path = urlsplit(handler.path).path
        with self._lock:
            page = self._pages.get(path)
            maker = self._makers.get(path)
            if maker is not None:
                count, maker.count = maker.count, maker.count + 1
        if maker is not None:
            page = _page(**{"body": "", **maker.make(count, request_headers)})
        if page is None:
            page = Page(b"not found", 404, {"Content-Type": "text/plain"})
        if page.delay:
            self._stopping.wait(page.delay)
        status, headers, send_body = page.status, dict(page.headers), True
        if 200 <= status < 300 and _not_modified(page, request_headers):
            status, send_body = 304, False
            headers = {k: v for k, v in headers.items() if k in ("ETag", "Last-Modified")}
        if handler.command == "HEAD":
            send_body = False
        size = page.size if page.size is not None else len(page.body)
        sent = 0
        try:
            handler.send_response(status)
            for name, value in headers.items():
                handler.send_header(name, value)
            if status != 304:
                if page.send_length:
                    handler.send_header("Content-Length", str(size))
                else:
                    handler.send_header("Connection", "close")
                    handler.close_connection = True
            handler.end_headers()
            if send_body:
                for chunk in self._chunks(page, size):
                    handler.wfile.write(chunk)
                    handler.wfile.flush()
                    sent += len(chunk)
                    if page.drip and self._stopping.wait(page.drip):
                        break
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
        record = Request(
            method=handler.command,
            target=handler.path,
            headers=request_headers,
            status=status,
            body_sent=sent > 0,
            bytes_sent=sent,
            started=started,
            finished=time.monotonic(),
            sni=getattr(handler.connection, "sni", None),
            header_names=tuple(handler.headers.keys()),
        )
        with self._lock:
            self._log.append(record)

    @staticmethod
    def _chunks(page: Page, size: int) -> Iterator[bytes]:
        if page.size is None:
            for start in range(0, len(page.body), CHUNK):
                yield page.body[start : start + CHUNK]
            return
        filler = b"a" * CHUNK
        left = size
        while left > 0:
            yield filler[: min(CHUNK, left)]
            left -= CHUNK


@pytest.fixture
def site() -> Iterator[TestSite]:
    """A started :class:`TestSite` on 127.0.0.1, stopped after the test."""
    with TestSite() as running:
        yield running


@pytest.fixture
def make_site() -> Iterator[Callable[..., TestSite]]:
    """Start more sites: ``make_site(host="127.0.0.2", tls=None)``; all stopped after the test."""
    started: list[TestSite] = []

    def make(host: str = "127.0.0.1", *, tls: tuple[str, str] | None = None) -> TestSite:
        running = TestSite(host, tls=tls).start()
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()
