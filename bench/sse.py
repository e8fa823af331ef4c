"""Latency of the batch event stream and on-demand throughput through the web UI.

Everything real, in one process tree: a fresh PostgreSQL database (default), a
local HTTP site, K agent subprocesses, ``jodl master`` (which serves the on-demand
queue) and ``jodl web`` (waitress), each a process of its own, so that this one
only submits, reads the streams and notes the times.

The benchmark signs in as a user of its own (created in the database, as ``jodl
users add`` does) and submits with a bearer token from ``POST /api/tokens``.

1. **Latency**: N URLs of the local site are submitted through the API and
   their batch stream is read over HTTP. A watcher polls the execution log every
   millisecond on its own connection and notes when each result is first
   visible (its commit); the figure is the time from there (or from the stream's
   opening, for a result committed before it) to the moment the result's SSE event
   reached the client (median and 95th percentile: ``p95_ms``).
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
    """Notes when each job's first done execution becomes visible: one thread polls every
    ms and, on PostgreSQL, another listens for the notice its commit sends
    (:data:`RESULTS_CHANNEL`, delivered at the commit itself); the earlier one counts."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.seen: dict[int, float] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._poll, daemon=True)]
        if engine.dialect.name == "postgresql":
            self.threads.append(threading.Thread(target=self._listen, daemon=True))

    def note(self, job_ids: list[int], now: float) -> None:
        with self.lock:
            for job_id in job_ids:
                if job_id not in self.seen or now < self.seen[job_id]:
                    self.seen[job_id] = now

    def _poll(self) -> None:
        from sqlalchemy import text

        query = text("SELECT DISTINCT job_id FROM jodl_execution WHERE state = 'done'")
        with self.engine.connect() as conn:
            while not self.stopping.is_set():
                started = time.monotonic()  # visible at the latest when the query began
                rows = conn.execute(query).all()
                conn.commit()  # a fresh snapshot for the next look
                self.note([job_id for (job_id,) in rows if job_id not in self.seen], started)
                time.sleep(0.001)

    def _listen(self) -> None:
        import psycopg
        from sqlalchemy import make_url

        from jodl.log import RESULTS_CHANNEL

        url = make_url(self.engine.url).set(drivername="postgresql")
        with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as conn:
            conn.execute(f"LISTEN {RESULTS_CHANNEL}")
            while not self.stopping.is_set():
                for notice in conn.notifies(timeout=0.1):
                    self.note([int(w) for w in notice.payload.split()], time.monotonic())

    def __enter__(self) -> CommitWatcher:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=5)


#: The benchmark's user (created in the fresh database) and its password.
EMAIL = "bench@example.org"
PASSWORD = "bench password, not secret"


def sign_in(web: str, engine: Any) -> dict[str, str]:
    """Create the benchmark's user; the headers of its bearer token (``POST /api/tokens``)."""
    import httpx
    from sqlalchemy.orm import sessionmaker

    from crawler_app.pages import add_user

    with sessionmaker(engine).begin() as s:
        add_user(s, EMAIL, PASSWORD)
    r = httpx.post(web + "/api/tokens", json={}, auth=(EMAIL, PASSWORD), timeout=60)
    r.raise_for_status()
    return {"Authorization": f"Bearer {r.json()['token']}"}


#: Key of a stream's arrivals that holds the moment it opened (no position is negative).
OPENED = -1


def read_stream(
    url: str, arrivals: dict[int, float], done: threading.Event, headers: dict[str, str]
) -> None:
    """Read one batch stream to its end; note when it opened (:data:`OPENED`) and each
    result's arrival time by position."""
    import httpx

    with (
        httpx.Client(timeout=120, headers=headers) as client,
        client.stream("GET", url) as response,
    ):
        response.raise_for_status()
        arrivals[OPENED] = time.monotonic()
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "result":
                arrivals[json.loads(line[6:])["position"]] = time.monotonic()
            elif line.startswith("data: ") and event == "complete":
                break
    done.set()


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
    for batch_id, arrivals in batches:
        for pos, jid in job_ids(engine, batch_id).items():
            if pos in arrivals and jid in seen:
                out.append((arrivals[pos] - max(seen[jid], arrivals[OPENED])) * 1000.0)
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
            warm = submit(web, [f"{base}/warm/{i}" for i in range(10)], auth)
            read_stream(web + warm["events"], {}, threading.Event(), auth)

            # 1. latency from commit to event, one stream
            arrivals: dict[int, float] = {}
            with CommitWatcher(engine) as watcher:
                batch = submit(web, [f"{base}/latency/{i}" for i in range(args.urls)], auth)
                read_stream(web + batch["events"], arrivals, threading.Event(), auth)
                time.sleep(0.05)
            latencies = latencies_ms(engine, [(batch["id"], arrivals)], watcher.seen)
            if len(latencies) != args.urls:
                raise SystemExit(f"only {len(latencies)} of {args.urls} results were timed")

            # 2. the same over many streams open at once, and on-demand throughput
            size = -(-args.jobs // streams)
            many: list[tuple[str, dict[int, float]]] = []
            threads = []
            with CommitWatcher(engine) as watcher:
                started = time.monotonic()
                for start in range(0, args.jobs, size):
                    count = min(size, args.jobs - start)
                    urls = [f"{base}/load/{start + i}" for i in range(count)]
                    sub = submit(web, urls, auth)
                    many.append((sub["id"], {}))
                    t = threading.Thread(
                        target=read_stream,
                        args=(web + sub["events"], many[-1][1], threading.Event(), auth),
                    )
                    t.start()
                    threads.append(t)
                for t in threads:
                    t.join(timeout=600)
                seconds = time.monotonic() - started
                time.sleep(0.05)
            spread = latencies_ms(engine, many, watcher.seen)
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
