"""The pinned HTTP/1.1 transport against real local servers: framing, keep-alive, limits.

A raw server (a thread per connection, answers written byte for byte by the test)
covers what a well-behaved HTTP library would never send: chunked bodies with
extensions and trailers, bodies ended by closing, kept connections the server
drops, stalls, garbage. HTTPS runs against the local site with a test CA.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from crawler_app.fetching.fetcher import Fetcher, FetchSettings, make_pool
from crawler_app.fetching.guard import check_url, parse_url
from crawler_app.fetching.transport import Timeouts, TransportError

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

LOOPBACK = ("127.0.0.0/8",)
FAST = FetchSettings(
    allow_networks=LOOPBACK, per_host_interval=0, total_timeout=10, obey_robots=False
)

#: Answers a request: (path, connection number from 0, request number on that connection)
#: -> raw bytes to send, (bytes, True) to send them and close, or None to close unanswered.
Script = Callable[[str, int, int], bytes | tuple[bytes, bool] | None]


def ok(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {len(body)}\r\n{head}\r\n"
    ).encode() + body


class RawServer:
    """A loopback TCP server answering each request with what ``script`` returns."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[tuple[int, str, dict[str, str]]] = []
        self.open_now = 0
        self.most_open = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self._sock.getsockname()[1]
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                number = self.connections
                self.connections += 1
                self.open_now += 1
                self.most_open = max(self.most_open, self.open_now)
            thread = threading.Thread(target=self._serve, args=(conn, number), daemon=True)
            thread.start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buffer = b""
        served = 0
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                with self._lock:
                    self.requests.append((number, path, headers))
                answer = self.script(path, number, served)
                served += 1
                if answer is None:
                    return
                if isinstance(answer, tuple):
                    conn.sendall(answer[0])
                    return
                conn.sendall(answer)
        except OSError:
            return
        finally:
            with self._lock:
                self.open_now -= 1
            conn.close()

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def raw() -> Iterator[Callable[[Script], RawServer]]:
    servers: list[RawServer] = []

    def make(script: Script) -> RawServer:
        server = RawServer(script)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def fetch_all(
    urls: Sequence[str], config: FetchSettings = FAST, *, together: bool = False
) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        async with Fetcher(config) as fetcher:
            if together:
                return list(await asyncio.gather(*(fetcher.fetch(u) for u in urls)))
            return [await fetcher.fetch(u) for u in urls]

    return asyncio.run(main())


# --- keep-alive ------------------------------------------------------------------------------


def test_one_kept_connection_serves_a_host_in_turn(raw: Callable[[Script], RawServer]) -> None:
    server = raw(lambda path, conn, n: ok(f"<p>{path} on {conn}.{n}</p>".encode()))
    results = fetch_all([server.url(f"/p{i}") for i in range(5)])
    assert [r["text"] for r in results] == [f"/p{i} on 0.{i}" for i in range(5)]
    assert server.connections == 1


def test_304_answers_keep_the_connection(raw: Callable[[Script], RawServer]) -> None:
    # No Content-Length on a 304: the answer has no body by definition.
    server = raw(lambda path, conn, n: b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\n\r\n')

    async def main() -> list[dict[str, Any]]:
        async with Fetcher(FAST) as fetcher:
            return [await fetcher.fetch(server.url(f"/p{i}"), etag='"v1"') for i in range(4)]

    results = asyncio.run(main())
    assert all(r["ok"] and r["not_modified"] for r in results)
    assert server.connections == 1


def test_a_kept_connection_the_server_dropped_is_replaced_once(
    raw: Callable[[Script], RawServer],
) -> None:
    # Each connection answers one request, then closes without saying so: the next
    # request finds the kept connection dead before any answer and goes on a new one.
    server = raw(lambda path, conn, n: ok(b"<p>hello</p>") if n == 0 else None)
    results = fetch_all([server.url(f"/p{i}") for i in range(3)])
    assert all(r["ok"] and r["text"] == "hello" for r in results)
    assert server.connections >= 3


def test_cookies_are_neither_kept_nor_sent(raw: Callable[[Script], RawServer]) -> None:
    server = raw(lambda path, conn, n: ok(b"<p>x</p>", "Set-Cookie: session=abc; Path=/"))

    async def main() -> list[dict[str, Any]]:
        async with Fetcher(FAST) as fetcher:
            return [await fetcher.fetch(server.url(f"/p{i}")) for i in range(2)]

    assert all(r["ok"] for r in asyncio.run(main()))
    assert [headers.get("cookie") for _, _, headers in server.requests] == [None, None]


def test_connection_close_and_http_1_0_are_not_kept(raw: Callable[[Script], RawServer]) -> None:
    def script(path: str, conn: int, n: int) -> bytes:
        if path == "/close":
            return ok(b"<p>a</p>", "Connection: close")
        return b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\nContent-Length: 8\r\n\r\n<p>b</p>"

    server = raw(script)
    results = fetch_all([server.url("/close"), server.url("/old"), server.url("/close")])
    assert [r["text"] for r in results] == ["a", "b", "a"]
    assert server.connections == 3


def test_the_pool_never_opens_more_than_its_limit(raw: Callable[[Script], RawServer]) -> None:
    release = threading.Event()

    def script(path: str, conn: int, n: int) -> bytes:
        release.wait(0.05)
        return ok(b"<p>x</p>")

    server = raw(script)
    config = dataclasses.replace(FAST, max_connections=2, per_host_in_flight=10)
    results = fetch_all([server.url(f"/p{i}") for i in range(8)], config, together=True)
    assert all(r["ok"] for r in results)
    assert server.most_open <= 2 and server.connections == 2


def test_a_kept_connection_reads_answers_of_every_framing_in_turn(
    raw: Callable[[Script], RawServer],
) -> None:
    # One parser reads every answer of a connection: each must start from a clean state.
    answers = [
        ok(b"<p>length</p>"),
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"e\r\n<p>chunked</p>\r\n0\r\nX-Trailer: yes\r\n\r\n",
        b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\n\r\n',
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + ok(b"<p>hinted</p>"),
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        ok(b"<p>last</p>", "X-Last: yes"),
    ]
    server = raw(lambda path, conn, n: answers[n])

    async def main() -> list[dict[str, Any]]:
        async with Fetcher(FAST) as fetcher:
            return [await fetcher.fetch(server.url(f"/p{i}"), etag='"v1"') for i in range(6)]

    results = asyncio.run(main())
    assert [r["status"] for r in results] == [200, 200, 304, 200, 404, 200]
    assert [r["text"] for r in results] == ["length", "chunked", None, "hinted", None, "last"]
    assert results[2]["not_modified"] and results[4]["error"] == "http_error"
    assert server.connections == 1


def test_fetches_leave_nothing_for_the_cycle_collector(
    raw: Callable[[Script], RawServer],
) -> None:
    # Objects in reference cycles wait for the collector, which then runs more often;
    # a fetch (the pool's connection and parser included) is freed by reference counts.
    server = raw(lambda path, conn, n: ok(f"<p>page {n}</p>".encode()))

    async def main() -> list[dict[str, Any]]:
        async with Fetcher(FAST) as fetcher:
            await fetcher.fetch(server.url("/warm"))
            gc.collect()
            gc.disable()
            try:
                gc.set_debug(gc.DEBUG_SAVEALL)
                return [await fetcher.fetch(server.url(f"/p{i}")) for i in range(20)]
            finally:
                gc.collect()
                gc.set_debug(0)
                gc.enable()

    try:
        results = asyncio.run(main())
        ours = [
            type(o).__qualname__
            for o in gc.garbage
            if type(o).__module__.startswith(("crawler_app.fetching", "httptools"))
            or (
                inspect.ismethod(o)
                and type(o.__self__).__module__.startswith("crawler_app.fetching")
            )
        ]
    finally:
        gc.garbage.clear()
    assert all(r["ok"] for r in results)
    assert ours == []


def test_a_deadline_bounds_the_wait_for_the_head_and_for_the_body(
    raw: Callable[[Script], RawServer],
) -> None:
    stop = threading.Event()

    def script(path: str, conn: int, n: int) -> bytes:
        if path == "/stalled-head":
            stop.wait(5)
            return ok(b"<p>late</p>")
        # The head and part of the body, then nothing more for a while.
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100\r\n\r\n"
        stop.wait(0.05)
        return head + b"<p>part"

    server = raw(script)
    timeouts = Timeouts(connect=5, read=5, pool=5)

    async def main() -> list[tuple[str, bool]]:
        loop = asyncio.get_running_loop()
        seen = []
        async with make_pool(FAST) as pool:
            target = check_url(server.url("/stalled-head"), allow=LOOPBACK)
            with pytest.raises(TransportError) as head_error:
                await pool.get(target, [], timeouts, deadline=loop.time() + 0.2)
            seen.append((head_error.value.code, head_error.value.deadline))
            target = check_url(server.url("/stalled-body"), allow=LOOPBACK)
            reply = await pool.get(target, [], timeouts, deadline=loop.time() + 0.5)
            seen.append(await body_error(reply))
            # The read timeout, nearer than the deadline, is told apart from it.
            reply = await pool.get(
                target, [], timeouts._replace(read=0.2), deadline=loop.time() + 30
            )
            seen.append(await body_error(reply))
        return seen

    async def body_error(reply: Any) -> tuple[str, bool]:
        """(code, deadline) of the error that ends reading ``reply``'s body."""
        try:
            with pytest.raises(TransportError) as error:
                while await reply.piece():
                    pass
        finally:
            reply.close()
        return error.value.code, error.value.deadline

    try:
        seen = asyncio.run(main())
    finally:
        stop.set()
    assert seen == [("timeout", True), ("timeout", True), ("timeout", False)]


# --- framing ---------------------------------------------------------------------------------


def test_chunked_bodies_with_extensions_and_trailers(raw: Callable[[Script], RawServer]) -> None:
    body = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"6;name=value\r\n<p>one\r\n"
        b"a\r\n two</p><p\r\n"
        b"8\r\n>three</\r\n"
        b"2\r\np>\r\n"
        b"0\r\nX-Trailer: yes\r\n\r\n"
    )
    server = raw(lambda path, conn, n: body)
    results = fetch_all([server.url("/a"), server.url("/b")])
    assert [r["text"] for r in results] == ["one two\nthree"] * 2
    assert results[0]["size"] == len(b"<p>one two</p><p>three</p>")
    assert server.connections == 1  # the chunked body was read to its end: connection kept


def test_a_body_ended_by_closing_is_read_whole(raw: Callable[[Script], RawServer]) -> None:
    body = b"<p>" + b"word " * 5000 + b"</p>"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n"
    server = raw(lambda path, conn, n: (head + body, True))
    first, second = fetch_all([server.url("/a"), server.url("/b")])
    assert first["ok"] and first["size"] == len(body)
    assert second["ok"] and server.connections == 2


def test_bodies_over_the_limit_stop_reading_and_drop_the_connection(
    raw: Callable[[Script], RawServer],
) -> None:
    big = b"<p>" + b"x" * 200_000 + b"</p>"

    def script(path: str, conn: int, n: int) -> bytes:
        if path == "/big":  # no Content-Length up front: only reading finds out
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            return head + b"%x\r\n" % len(big) + big + b"\r\n0\r\n\r\n"
        return ok(b"<p>small</p>")

    server = raw(script)
    config = dataclasses.replace(FAST, max_bytes=10_000)
    big_result, small = fetch_all([server.url("/big"), server.url("/small")], config)
    assert big_result["error"] == "too_large"
    assert small["ok"] and small["text"] == "small"
    assert server.connections == 2  # the half-read connection was not reused


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (b"HTTP/1.1 20 OK\r\n\r\n", "protocol_error"),
        (b"SPDY/3 200 OK\r\n\r\n", "protocol_error"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
            "protocol_error",
        ),
        (b"HTTP/1.1 200 OK\r\n folded: header\r\n\r\n", "protocol_error"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "protocol_error"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ntoo short", "protocol_error"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000, "protocol_error"),
    ],
)
def test_broken_answers_are_protocol_errors(
    raw: Callable[[Script], RawServer], answer: bytes, code: str
) -> None:
    server = raw(lambda path, conn, n: (answer, True))  # then closes
    (result,) = fetch_all([server.url("/")])
    assert result["ok"] is False and result["error"] == code, result


H = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
CHUNKED = H + b"Transfer-Encoding: chunked\r\n\r\n"

#: Malformed answers: (answer, whether the server then closes). Kept open, a broken
#: answer must be noticed from its bytes alone, not from the close.
MALFORMED = {
    "bad chunk size": (CHUNKED + b"zz\r\n<p>x</p>\r\n0\r\n\r\n", False),
    "chunk size overflow": (CHUNKED + b"1" * 40 + b"\r\n<p>x</p>\r\n0\r\n\r\n", False),
    "chunk longer than its size": (CHUNKED + b"2\r\n<p>x</p>\r\n0\r\n\r\n", False),
    "negative chunk size": (CHUNKED + b"-8\r\n<p>x</p>\r\n0\r\n\r\n", False),
    "duplicate Content-Length": (
        H + b"Content-Length: 8\r\nContent-Length: 8\r\n\r\n<p>x</p>",
        False,
    ),
    "conflicting Content-Length": (
        H + b"Content-Length: 8\r\nContent-Length: 9\r\n\r\n<p>x</p>",
        False,
    ),
    "Content-Length list": (H + b"Content-Length: 8, 9\r\n\r\n<p>x</p>", False),
    "negative Content-Length": (H + b"Content-Length: -8\r\n\r\n<p>x</p>", False),
    "Content-Length and chunked": (
        H + b"Content-Length: 8\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n<p>x</p>\r\n0\r\n\r\n",
        False,
    ),
    "obs-fold header": (H + b"X-Folded: one\r\n two\r\nContent-Length: 8\r\n\r\n<p>x</p>", False),
    "space before colon": (H + b"X-Bad : x\r\nContent-Length: 8\r\n\r\n<p>x</p>", False),
    "NUL in a header": (H + b"X-Nul: a\x00b\r\nContent-Length: 8\r\n\r\n<p>x</p>", False),
    "bare LF line ends": (b"HTTP/1.1 200 OK\nContent-Length: 8\n\n<p>x</p>", False),
    "overlong header line": (H + b"X-Long: " + b"y" * 100_000 + b"\r\n\r\n", False),
    "overlong status line": (b"HTTP/1.1 200 " + b"O" * 100_000 + b"\r\n\r\n", False),
    "too many headers": (H + b"X-Many: y\r\n" * 1000 + b"Content-Length: 0\r\n\r\n", False),
    "1xx flood": (b"HTTP/1.1 100 Continue\r\n\r\n" * 1000, False),
    "switching protocols": (
        b"HTTP/1.1 101 Switching\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n",
        False,
    ),
    "status out of range": (b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n", False),
    "not HTTP": (b"SPDY/3 200 OK\r\n\r\n", False),
    "early close in the head": (b"HTTP/1.1 200 OK\r\nContent-Le", True),
    "early close in the body": (H + b"Content-Length: 100\r\n\r\n<p>too short", True),
    "early close in a chunk": (CHUNKED + b"100\r\n<p>too short", True),
    "early close before the last chunk": (CHUNKED + b"8\r\n<p>x</p>\r\n", True),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_answers_fail_their_url_alone_and_leak_nothing(
    raw: Callable[[Script], RawServer], case: str
) -> None:
    answer, close = MALFORMED[case]

    def script(path: str, conn: int, n: int) -> bytes | tuple[bytes, bool]:
        if path == "/bad":
            return (answer, True) if close else answer
        return ok(b"<p>fine</p>")

    server = raw(script)
    # A hung connection would end in a timeout: these are short, and the error must not be one.
    config = dataclasses.replace(FAST, read_timeout=3, total_timeout=5)

    async def main() -> tuple[list[dict[str, Any]], tuple[int, int]]:
        async with Fetcher(config) as fetcher:
            results = [await fetcher.fetch(server.url(p)) for p in ("/good", "/bad", "/good")]
            results += await asyncio.gather(*(fetcher.fetch(server.url("/good")) for _ in range(3)))
            return results, fetcher.pool.connections

    results, (open_now, idle) = asyncio.run(main())
    bad = results[1]
    assert (bad["ok"], bad["error"]) == (False, "protocol_error"), bad
    assert bad["error_message"].startswith(server.url("/bad") + ": the server broke HTTP")
    assert all(r["ok"] and r["text"] == "fine" for r in results[:1] + results[2:])
    assert open_now == idle  # no connection left in use: the pool is not poisoned
    # The broken connection was dropped: /bad was the last request it carried.
    (carrier,) = [n for n, path, _ in server.requests if path == "/bad"]
    assert [path for n, path, _ in server.requests if n == carrier][-1] == "/bad"


def test_bytes_after_a_whole_answer_keep_it_but_not_the_connection(
    raw: Callable[[Script], RawServer],
) -> None:
    server = raw(lambda path, conn, n: ok(b"<p>fine</p>") + b"HTTP/1.1 200 OK\r\nSURPLUS")
    first, second = fetch_all([server.url("/a"), server.url("/b")])
    assert first["ok"] and second["ok"] and first["text"] == "fine"
    assert server.connections == 2


def test_interim_answers_are_skipped(raw: Callable[[Script], RawServer]) -> None:
    server = raw(
        lambda path, conn, n: (
            b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + ok(b"<p>final</p>")
        )
    )
    (result,) = fetch_all([server.url("/")])
    assert result["status"] == 200 and result["text"] == "final"


def test_a_stalled_answer_hits_the_read_timeout(raw: Callable[[Script], RawServer]) -> None:
    stop = threading.Event()

    def script(path: str, conn: int, n: int) -> bytes:
        stop.wait(5)  # never answers within the test's read timeout
        return ok(b"<p>late</p>")

    server = raw(script)
    config = dataclasses.replace(FAST, read_timeout=0.3)
    try:
        (result,) = fetch_all([server.url("/")], config)
    finally:
        stop.set()
    assert result["error"] == "timeout" and "read timeout" in result["error_message"]


# --- pinning ---------------------------------------------------------------------------------


TIMEOUTS = Timeouts(connect=5, read=5, pool=5)


def test_requests_go_to_the_pinned_address_only(raw: Callable[[Script], RawServer]) -> None:
    server = raw(lambda path, conn, n: ok(b"<p>x</p>"))
    target = check_url(server.url("/x"), allow=LOOPBACK)

    async def main() -> None:
        async with make_pool(FAST) as pool:
            # A parsed URL the guard did not check: refused before any connection.
            unchecked = parse_url(server.url("/x"))
            with pytest.raises(TransportError, match="not checked by the guard"):
                await pool.get(unchecked, [], TIMEOUTS)  # type: ignore[arg-type]
            # A checked target without its address: refused too.
            with pytest.raises(TransportError, match="not checked by the guard"):
                await pool.get(dataclasses.replace(target, address=""), [], TIMEOUTS)
            # The checked one goes through, to its address.
            reply = await pool.get(target, [], TIMEOUTS)
            assert reply.status == 200 and await reply.piece() == b"<p>x</p>"
            assert await reply.piece() == b""
            reply.close()

    asyncio.run(main())
    assert [path for _, path, _ in server.requests] == ["/x"]


def test_the_host_header_names_the_host_while_the_socket_goes_to_the_address(
    raw: Callable[[Script], RawServer],
) -> None:
    server = raw(lambda path, conn, n: ok(b"<p>x</p>"))

    async def resolve(host: str, port: int) -> Sequence[str]:
        return ["127.0.0.1"]

    async def main() -> dict[str, Any]:
        async with Fetcher(FAST, resolve=resolve) as fetcher:
            return await fetcher.fetch(f"http://pages.test:{server.port}/x")

    result = asyncio.run(main())
    assert result["ok"]
    assert server.requests[0][2]["host"] == f"pages.test:{server.port}"


def test_header_injection_is_refused() -> None:
    target = check_url("http://127.0.0.1:9/x", allow=LOOPBACK)

    async def main() -> None:
        async with make_pool(FAST) as pool:
            for headers in ([("X-A", "1\r\nX-B: 2")], [("X-A", "1\n")], [("X-A", "a\x00")]):
                with pytest.raises(TransportError, match="line break or NUL"):
                    await pool.get(target, headers, TIMEOUTS)
            assert pool.connections == (0, 0)  # refused before any connection

    asyncio.run(main())


def test_the_request_target_is_the_checked_path_encoded_as_sent(
    raw: Callable[[Script], RawServer],
) -> None:
    server = raw(lambda path, conn, n: ok(b"<p>x</p>"))
    paths = ["/plain/a-b_c.~!$&'()*+,;=:@?q=1&r=%2F", "/caf\u00e9?q=\u00e9", "/a/./b/../c", '/x"y']
    results = fetch_all([server.url(p) for p in paths])
    assert all(r["ok"] for r in results)
    assert [path for _, path, _ in server.requests] == [
        "/plain/a-b_c.~!$&'()*+,;=:@?q=1&r=%2F", "/caf%C3%A9?q=%C3%A9", "/a/c", "/x%22y",
    ]  # fmt: skip


# --- TLS -------------------------------------------------------------------------------------


def test_https_connections_are_kept_and_checked(
    make_site: Callable[..., TestSite], certificates: dict[str, tuple[str, str]]
) -> None:
    site = make_site(tls=certificates["pages.test"])
    for i in range(3):
        site.set_page(f"/s{i}", f"<p>secure {i}</p>")

    async def resolve(host: str, port: int) -> Sequence[str]:
        return ["127.0.0.1"]

    async def main() -> tuple[list[dict[str, Any]], tuple[int, int]]:
        config = dataclasses.replace(FAST, ca_file=certificates["pages.test"][0])
        async with Fetcher(config, resolve=resolve) as fetcher:
            results = [
                await fetcher.fetch(f"https://pages.test:{site.port}/s{i}") for i in range(3)
            ]
            return results, fetcher.pool.connections

    results, (open_now, idle) = asyncio.run(main())
    assert [r["text"] for r in results] == [f"secure {i}" for i in range(3)]
    assert (open_now, idle) == (1, 1)  # one TLS connection served all three
    assert {r.sni for r in site.wait_requests(count=3)} == {"pages.test"}


def test_a_ca_file_is_trusted_by_the_pools_given_it_alone(
    make_site: Callable[..., TestSite], certificates: dict[str, tuple[str, str]]
) -> None:
    # Pools share TLS contexts made once per process: one per set of trusted CAs.
    site = make_site(tls=certificates["pages.test"])
    site.set_page("/s", "<p>secure</p>")

    async def resolve(host: str, port: int) -> Sequence[str]:
        return ["127.0.0.1"]

    async def fetch(config: FetchSettings) -> dict[str, Any]:
        async with Fetcher(config, resolve=resolve) as fetcher:
            return await fetcher.fetch(f"https://pages.test:{site.port}/s")

    trusting = dataclasses.replace(FAST, ca_file=certificates["pages.test"][0])
    results = [asyncio.run(fetch(config)) for config in (FAST, trusting, FAST, trusting)]
    assert [r["ok"] for r in results] == [False, True, False, True]
    assert results[0]["error"] == results[2]["error"] == "connect_error"
    assert "TLS failed" in results[2]["error_message"]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """A self-signed certificate for pages.test (made with openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "pages.test.crt", folder / "pages.test.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
         "-subj", "/CN=pages.test", "-addext", "subjectAltName=DNS:pages.test",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return {"pages.test": (str(cert), str(key))}
