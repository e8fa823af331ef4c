"""Real processes and clients for the web tests: ``jodl web``, a serving master, SSE.

* :func:`start_web` runs ``jodl web`` as a subprocess on a free loopback port and
  returns once ``/healthz`` answers.
* :class:`ServingMaster` runs a master with the on-demand queue feeder in a thread
  of the test (as ``jodl up`` does), so submitted URLs reach the real agents.
* :class:`EventStream` reads Server-Sent Events over a real HTTP connection and
  notes when each event arrived.
* :class:`ReverseProxy` stands in front of ``jodl web`` as nginx would, adding the
  client's address to X-Forwarded-For; :func:`client_at` is an HTTP client whose
  connections come from a given loopback address (127.0.0.2, ...), a client of its own.
"""

from __future__ import annotations

import http.client
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from agents import child_env, free_port, jodl_command, wait_for

from jodl.log import Store
from jodl.master import Master
from jodl.queue import Queue, QueueFeeder
from jodl.settings.config import Settings

#: Settings of every agent the web tests start: loopback fetches, no politeness pauses.
AGENT_ENV = {
    "JODL_FETCH_ALLOW": "127.0.0.0/8",
    "JODL_FETCH_HOST_INTERVAL": "0",
    "JODL_FETCH_HOST_IN_FLIGHT": "50",
}


@dataclass
class WebProcess:
    """A running ``jodl web``."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_web(database_url: str, log_dir: Path, env: Mapping[str, str] | None = None) -> WebProcess:
    """``jodl web`` on a free port with the test's settings; returns once it answers."""
    for _ in range(5):
        port = free_port()
        log_path = log_dir / f"web-{port}.log"
        full = {
            "JODL_DATABASE_URL": database_url,
            "JODL_WEB_SECURE_COOKIES": "false",
            "JODL_WEB_SECRET_KEY": "test-secret-key",
            "JODL_LOG_LEVEL": "WARNING",
            **(env or {}),
        }
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(
                [*jodl_command(), "web", "--listen", f"127.0.0.1:{port}"],
                env=child_env(full),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        web = WebProcess(proc, port, log_path)

        def up(web: WebProcess = web) -> bool:
            if web.proc.poll() is not None:
                return True
            try:
                return httpx.get(web.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=30, what="jodl web to answer")
        if proc.poll() is None:
            return web
        if "cannot listen" not in web.log():
            raise RuntimeError(f"jodl web did not start:\n{web.log()}")
    raise RuntimeError("no free port for jodl web")


class ServingMaster:
    """A serving master with the queue feeder, in a thread (stopped by :meth:`stop`)."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.master = Master(settings, store=store, name="test-master")
        self.queue = Queue(store)
        self.master.feeders.append(QueueFeeder(self.queue))
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-master", daemon=True)

    def _run(self) -> None:
        try:
            self.master.serve(self.stopping)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
        finally:
            self.master.close()
            self.queue.close()

    def start(self) -> ServingMaster:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"the master failed: {self.error!r}")


@dataclass
class Event:
    """One Server-Sent Event as received."""

    event: str
    data: str
    id: str | None
    received: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        import json

        return json.loads(self.data)


class EventStream:
    """An open ``text/event-stream`` response read event by event."""

    def __init__(
        self,
        url: str,
        last_event_id: str | None = None,
        timeout: float = 60.0,
        auth: tuple[str, str] | None = None,
        local_address: str | None = None,
    ) -> None:
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        # local_address: the loopback address the connection leaves from (a client of its own).
        transport = httpx.HTTPTransport(local_address=local_address) if local_address else None
        self.client = httpx.Client(timeout=httpx.Timeout(timeout), auth=auth, transport=transport)
        self._cm = self.client.stream("GET", url, headers=headers)
        self.response = self._cm.__enter__()
        self.retry: int | None = None
        self._lines: Iterator[str] = self.response.iter_lines()

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self.next()
            if event is None:
                return
            yield event

    def next(self) -> Event | None:
        """The next event, or None when the server closed the stream."""
        fields: dict[str, str] = {}
        for line in self._lines:
            if line == "":
                if "event" in fields or "data" in fields:
                    return Event(
                        fields.get("event", "message"), fields.get("data", ""), fields.get("id")
                    )
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "retry":
                self.retry = int(value)
            else:
                fields[name] = value
        return None

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self.client.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Headers of one connection, never forwarded by a proxy (RFC 9110, 7.6.1).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
     "upgrade", "content-length"}
)  # fmt: skip


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        prior = self.headers.get("X-Forwarded-For")
        client = self.client_address[0]
        headers["X-Forwarded-For"] = f"{prior}, {client}" if prior else client
        headers["X-Forwarded-Proto"] = "http"
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=30)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        self.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward  # noqa: N815 - stdlib naming


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    upstream_port = 0


class ReverseProxy:
    """A reverse proxy on a free loopback port in front of ``upstream_port``: each request
    goes there with the client's address appended to X-Forwarded-For (whole bodies, one
    request per connection; enough for pages and JSON, not for event streams)."""

    def __init__(self, upstream_port: int) -> None:
        self._server = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)
        self._server.upstream_port = upstream_port
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ReverseProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def client_at(address: str, **kwargs: Any) -> httpx.Client:
    """An HTTP client whose connections leave from ``address`` (any 127.x.y.z is this
    machine's loopback): to a server it is a client of that address."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30, **kwargs)
