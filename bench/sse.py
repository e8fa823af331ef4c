"""Latency of the batch event stream and on-demand throughput through the web UI.

Everything real, in one process tree: a fresh PostgreSQL database (default), a
local HTTP site, K agent subprocesses, ``jodl master`` (which serves the on-demand
queue) and ``jodl web`` (waitress), each a process of its own. This one submits; the
measuring client is a process of its own too (one thread, one selector): it reads
every stream over a raw socket and takes each time right after its read, so neither
the site nor the submissions delay it.

The benchmark signs in as a user of its own (created in the database, as ``jodl
users add`` does) and submits with a bearer token from ``POST /api/tokens``.

1. **Latency**: N URLs of the local site are submitted through the API and
   their batch stream is read over HTTP. The moment each result commits is the
   moment its notice reaches the client (PostgreSQL delivers ``NOTIFY`` at the
   commit; the client LISTENs on the selector that reads the streams); on SQLite,
   which has no notices, a watcher polls the execution log every millisecond. The
   figure is the time from there (or from the stream's opening, for a result
   committed before it) to the moment the result's SSE event reached the client
   (median and 95th percentile: ``p95_ms``).
2. **Many streams**: M more URLs are submitted in S batches, all S streams read
   at once; the same latency over all of them (``p95_ms_50_streams`` for the
   default 50 streams), and on-demand jobs per second from the first submission
   to the last event.

The last line printed is one JSON object with the figures.

    python bench/sse.py --urls 100 --jobs 1000 --streams 50 --agents 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    DEFAULT_PG,
    SECRET,
    agents,
    free_port,
    fresh_database,
    stop_all,
    wait_port,
)

AGENT_ENV = {
    "JODL_FETCH_ALLOW": "127.0.0.0/8",
    "JODL_FETCH_HOST_INTERVAL": "0",
    "JODL_FETCH_HOST_IN_FLIGHT": "100",
    "JODL_FETCH_ROBOTS": "false",
}


class _Page(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        body = (
            f"<html><head><title>Page {self.path}</title></head>"
            f"<body><p>Text of {self.path}, served for the benchmark.</p></body></html>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Site(ThreadingHTTPServer):
    # The default listen backlog (5) overflows when an agent opens its connections at
    # once: dropped SYNs come back after 1, 3, 7 s and the figures measure that.
    request_queue_size = 1024
    daemon_threads = True


def start_site() -> tuple[ThreadingHTTPServer, str]:
    server = _Site(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class CommitWatcher:
    """On SQLite, which has no notices, notes when each job's first done execution becomes
    visible: a thread polls every ms (visible at the latest when the query began).

    On PostgreSQL the :class:`Client` notes the commits instead, from the notice each
    one sends (:data:`RESULTS_CHANNEL`, delivered at the commit itself). Polling there
    too cost a CPU of two (1,000 queries a second, each reading every done job) and
    slowed what it measured."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.seen: dict[int, float] = {}
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        if engine.dialect.name != "postgresql":
            self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        from sqlalchemy import text

        query = text("SELECT DISTINCT job_id FROM jodl_execution WHERE state = 'done'")
        with self.engine.connect() as conn:
            while not self.stopping.is_set():
                started = time.monotonic()
                rows = conn.execute(query).all()
                conn.commit()  # a fresh snapshot for the next look
                for (job_id,) in rows:
                    self.seen.setdefault(job_id, started)
                time.sleep(0.001)

    def __enter__(self) -> CommitWatcher:
        if self.thread is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


#: Key of a stream's arrivals that holds the moment it opened (no position is negative).
OPENED = -1


class _Stream:
    """One stream as the client reads it: HTTP/1.0 (no chunking), events by line."""

    def __init__(self, key: int) -> None:
        self.key = key
        self.buffer = b""
        self.head = True
        self.event = ""
        self.done = False
        self.arrivals: dict[int, float] = {}

    def feed(self, data: bytes, now: float) -> None:
        self.buffer += data
        if self.head:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            status = self.buffer.split(b" ", 2)[1]
            if status != b"200":
                raise SystemExit(f"stream {self.key} answered {status.decode()}")
            self.arrivals[OPENED] = now
            self.buffer = self.buffer[end + 4 :]
            self.head = False
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            line = raw.decode().rstrip("\r")
            if line.startswith("event: "):
                self.event = line[7:]
            elif line.startswith("data: ") and self.event == "result":
                self.arrivals[json.loads(line[6:])["position"]] = now
            elif line.startswith("data: ") and self.event == "complete":
                self.done = True


def _notices(listening: Any, seen: dict[int, float]) -> None:
    """Note the jobs of every notice the LISTEN connection has received. Read with libpq's
    own calls: all the socket holds, then every notice parsed (a notice left in the
    client's buffer would never make the socket readable again)."""
    pgconn = listening.pgconn
    pgconn.consume_input()
    now = time.monotonic()
    while (notice := pgconn.notifies()) is not None:
        for word in notice.extra.split():
            seen.setdefault(int(word), now)


def _client_main(conn: Any, port: int, db_url: str | None) -> None:
    """The client process: one thread, one selector over its orders, the streams' sockets
    and (PostgreSQL) the LISTEN connection; every time taken right after its read."""
    import selectors
    import socket

    selector = selectors.DefaultSelector()
    selector.register(conn, selectors.EVENT_READ, "orders")
    seen: dict[int, float] = {}
    listening = None
    if db_url is not None:
        import psycopg
        from sqlalchemy import make_url

        from jodl.log import RESULTS_CHANNEL

        url = make_url(db_url).set(drivername="postgresql")
        listening = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)
        listening.execute(f"LISTEN {RESULTS_CHANNEL}")
        selector.register(listening.fileno(), selectors.EVENT_READ, "notices")
    conn.send("ready")
    streams: list[_Stream] = []
    open_streams = 0
    finishing = False
    while not (finishing and open_streams == 0):
        for key, _ in selector.select(timeout=1.0):
            if key.data == "orders":
                order = conn.recv()
                if order[0] == "finish":
                    finishing = True
                    continue
                _, number, path, headers = order
                sock = socket.create_connection(("127.0.0.1", port))
                lines = [f"GET {path} HTTP/1.0", f"Host: 127.0.0.1:{port}"]
                lines += [f"{k}: {v}" for k, v in headers.items()]
                sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
                sock.setblocking(False)
                stream = _Stream(number)
                streams.append(stream)
                open_streams += 1
                selector.register(sock, selectors.EVENT_READ, stream)
            elif key.data == "notices":
                assert listening is not None
                _notices(listening, seen)
            else:
                stream = key.data
                sock = key.fileobj  # type: ignore[assignment]
                data = sock.recv(65536)
                now = time.monotonic()
                if data:
                    stream.feed(data, now)
                if not data or stream.done:
                    selector.unregister(sock)
                    sock.close()
                    open_streams -= 1
    if listening is not None:
        _notices(listening, seen)  # every stream ended: their commits' notices are here
    conn.send(({s.key: s.arrivals for s in streams}, seen))
    if listening is not None:
        listening.close()


class Client:
    """The measuring client (:func:`_client_main`), a process of its own so that no thread
    of this one (the site, the submissions) delays its reads."""

    def __init__(self, port: int, db_url: str) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        pg = db_url if db_url.startswith("postgresql") else None
        self.proc = context.Process(target=_client_main, args=(child, port, pg), daemon=True)
        self.proc.start()
        if not self.conn.poll(60) or self.conn.recv() != "ready":
            raise SystemExit("the measuring client did not start")
        self.count = 0

    def open(self, path: str, headers: dict[str, str]) -> int:
        """Read the stream at ``path``; its number."""
        self.count += 1
        self.conn.send(("open", self.count, path, headers))
        return self.count

    def finish(self) -> tuple[dict[int, dict[int, float]], dict[int, float]]:
        """Once every stream ended: each one's arrivals by number, and the commits seen."""
        self.conn.send(("finish",))
        if not self.conn.poll(600):
            raise SystemExit("the streams did not end")
        arrivals, seen = self.conn.recv()
        self.proc.join(10)
        return arrivals, seen


#: The benchmark's user (created in the fresh database) and its password.
EMAIL = "bench@example.org"
PASSWORD = "bench password, not secret"


def sign_in(web: str, engine: Any) -> dict[str, str]:
    """Create the benchmark's user; the headers of its bearer token (``POST /api/tokens``)."""
    import httpx
    from sqlalchemy.orm import sessionmaker

    from crawler_app.users.pages import add_user

    with sessionmaker(engine).begin() as s:
        add_user(s, EMAIL, PASSWORD)
    r = httpx.post(web + "/api/tokens", json={}, auth=(EMAIL, PASSWORD), timeout=60)
    r.raise_for_status()
    return {"Authorization": f"Bearer {r.json()['token']}"}


def earliest(*seen: dict[int, float]) -> dict[int, float]:
    """The earliest time each job was seen committed by any of these watchers."""
    out: dict[int, float] = {}
    for times in seen:
        for job_id, t in times.items():
            out[job_id] = min(t, out.get(job_id, t))
    return out


def submit(web: str, urls: list[str], headers: dict[str, str]) -> dict[str, Any]:
    import httpx

    r = httpx.post(web + "/api/batches", json={"urls": urls}, headers=headers, timeout=60)
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def job_ids(engine: Any, batch_id: str) -> dict[int, int]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT position, job_id FROM web_batch_item WHERE batch_id = :b"),
            {"b": batch_id},
        ).all()
    return {pos: jid for pos, jid in rows}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def latencies_ms(
    engine: Any, batches: list[tuple[str, dict[int, float]]], seen: dict[int, float]
) -> list[float]:
    """Commit-to-event milliseconds of every result of these (batch id, arrivals); from
    the stream's opening for a result committed before it (nothing could push it then)."""
    out = []
    lost = unseen = 0
    for batch_id, arrivals in batches:
        for pos, jid in job_ids(engine, batch_id).items():
            lost += pos not in arrivals
            unseen += jid not in seen
            if pos in arrivals and jid in seen:
                out.append((arrivals[pos] - max(seen[jid], arrivals[OPENED])) * 1000.0)
    if lost or unseen:
        raise SystemExit(f"{lost} results never reached their stream; {unseen} commits unseen")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("JODL_BENCH_DATABASE_URL", DEFAULT_PG)
    )
    parser.add_argument("--urls", type=int, default=100, help="URLs of the latency batch")
    parser.add_argument("--jobs", type=int, default=1000, help="URLs of the many-streams run")
    parser.add_argument("--streams", type=int, default=50, help="streams of the many-streams run")
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4)
    args = parser.parse_args()
    streams = max(1, min(args.streams, args.jobs))

    from jodl import Store, make_engine
    from jodl.log.migrate import upgrade

    site, base = start_site()
    with (
        fresh_database(args.database_url) as db_url,
        agents(args.agents, slots=args.slots, env=AGENT_ENV) as addresses,
    ):
        engine = make_engine(db_url)
        upgrade(engine)
        store = Store(engine)
        for address in addresses:
            store.add_node(address, slots=args.slots)
        master_env = {
            **os.environ,
            "JODL_DATABASE_URL": db_url,
            "JODL_LOG_LEVEL": "WARNING",
            "JODL_SECRET": SECRET,
            "JODL_METRICS_LISTEN": "",
        }
        master = subprocess.Popen(
            [sys.executable, "-m", "jodl", "master"],
            env=master_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port = free_port()
        # The product's stream settings; room for every stream of one user at once.
        env = {
            **os.environ,
            "JODL_DATABASE_URL": db_url,
            "JODL_LOG_LEVEL": "WARNING",
            "JODL_SECRET": SECRET,
            "JODL_WEB_SECURE_COOKIES": "false",
            "JODL_WEB_SUBMIT_BURST": "10000",
            "JODL_WEB_THREADS": str(streams + 24),
            "JODL_WEB_MAX_STREAMS": str(streams + 8),
            "JODL_WEB_STREAMS_PER_CLIENT": str(streams + 8),
            "JODL_USER_URLS_PER_DAY": "0",
            "JODL_USER_MAX_BATCH": "0",
        }
        web_proc = subprocess.Popen(
            [sys.executable, "-m", "jodl", "web", "--listen", f"127.0.0.1:{port}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        web = f"http://127.0.0.1:{port}"
        try:
            wait_port(port, timeout=30)
            auth = sign_in(web, engine)
            # Warm-up: the agents' fetchers, the master's connections, the web process.
            client = Client(port, db_url)
            warm = submit(web, [f"{base}/warm/{i}" for i in range(10)], auth)
            client.open(warm["events"], auth)
            client.finish()

            # 1. latency from commit to event, one stream
            client = Client(port, db_url)
            with CommitWatcher(engine) as watcher:
                batch = submit(web, [f"{base}/latency/{i}" for i in range(args.urls)], auth)
                number = client.open(batch["events"], auth)
                arrivals, seen = client.finish()
                time.sleep(0.05)
            seen = earliest(seen, watcher.seen)
            latencies = latencies_ms(engine, [(batch["id"], arrivals[number])], seen)
            if len(latencies) != args.urls:
                raise SystemExit(f"only {len(latencies)} of {args.urls} results were timed")

            # 2. the same over many streams open at once, and on-demand throughput
            size = -(-args.jobs // streams)
            opened: list[tuple[str, int]] = []
            client = Client(port, db_url)
            with CommitWatcher(engine) as watcher:
                started = time.monotonic()
                for start in range(0, args.jobs, size):
                    count = min(size, args.jobs - start)
                    urls = [f"{base}/load/{start + i}" for i in range(count)]
                    sub = submit(web, urls, auth)
                    opened.append((sub["id"], client.open(sub["events"], auth)))
                arrivals, seen = client.finish()
                time.sleep(0.05)
            last = max(t for a in arrivals.values() for p, t in a.items() if p != OPENED)
            seconds = last - started
            seen = earliest(seen, watcher.seen)
            many = [(batch_id, arrivals[number]) for batch_id, number in opened]
            spread = latencies_ms(engine, many, seen)
            if len(spread) != args.jobs:
                raise SystemExit(f"only {len(spread)} of {args.jobs} results were timed")
        finally:
            stop_all([web_proc, master], wait=30)
            engine.dispose()
            site.shutdown()

    figures = {
        "database": db_url.split(":", 1)[0].split("+")[0],
        "agents": args.agents,
        "urls": args.urls,
        "median_ms": round(statistics.median(latencies), 2),
        "p95_ms": round(percentile(latencies, 0.95), 2),
        "max_ms": round(max(latencies), 2),
        "streams": len(many),
        "median_ms_many_streams": round(statistics.median(spread), 2),
        f"p95_ms_{len(many)}_streams": round(percentile(spread, 0.95), 2),
        "ondemand_jobs": args.jobs,
        "ondemand_seconds": round(seconds, 2),
        "ondemand_jobs_per_s": round(args.jobs / seconds, 1),
    }
    print(
        f"commit -> SSE event over {args.urls} URLs in one stream: "
        f"median {figures['median_ms']} ms, p95 {figures['p95_ms']} ms"
    )
    print(
        f"commit -> SSE event over {args.jobs} URLs in {len(many)} streams: "
        f"median {figures['median_ms_many_streams']} ms, "
        f"p95 {figures[f'p95_ms_{len(many)}_streams']} ms"
    )
    print(
        f"on-demand check_page jobs through API, queue and {args.agents} agents: "
        f"{args.jobs} in {seconds:.2f}s = {figures['ondemand_jobs_per_s']} jobs/s"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
