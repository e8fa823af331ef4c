"""Pages per second through the ``check_page`` family, against a bare asyncio + httpx loop.

A local site (its own process, asyncio, HTTP/1.1 keep-alive) answers every page
after a fixed latency (20 ms by default) with a small HTML page carrying an ETag.
N pages (5,000 by default) are tracked; one application cycle checks them all
through a master and ONE agent subprocess running ``check_page`` (SSRF guard,
politeness, conditional GET, HTML to text, fingerprints, results logged in the
database). A second cycle checks them again (all ``304 Not Modified``). In the
same invocation a bare loop (``asyncio`` + one ``httpx.AsyncClient`` with its
default transport, bodies read, nothing parsed or stored) fetches the same pages
at the same concurrency and at 20, 50 and 100 in flight (httpx's connection pool
slows down as it grows), on asyncio's own event loop and on uvloop (the agent's
default loop), before and after; its best run is the peer.

Pages per second are those of the check step (the JODL cycle of ``check_page``).
CPU milliseconds per page are reported per process for that step (agent, master,
site, PostgreSQL when used) and summed: the machine's cores bound the sum, and
one agent is one process (one core at most), so its share bounds its pages per
second. The last line printed is one JSON object with the figures.

The fetcher alone is compared with aiohttp, in this process (no master, no
database): our :class:`~crawler_app.fetching.fetcher.Fetcher` as ``check_page``
uses it (SSRF guard, politeness, robots.txt, GET, bounded decoding, text and
fingerprint) against one ``aiohttp.ClientSession`` that reads each body and runs
the same text extraction on it (:func:`~crawler_app.fetching.fetcher.text_fields`),
same pages, same concurrency, same event loop; runs interleaved, the best of
each counts (``ratio_aiohttp``, target at least 1.0). Their CPU milliseconds per
page are reported too: on a busy machine the steadier figure.

The default concurrency, 100, is what the product runs with by default: the
fetcher opens at most 100 connections per agent (``JODL_FETCH_MAX_CONNECTIONS``)
and the agent runs up to 200 fetches at once (``JODL_AGENT_ASYNC_SLOTS``); here
all pages are on one host, so the per-host limit is lifted to the same 100.

    python bench/pagecheck.py --pages 5000 --latency 0.02 --concurrency 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import SECRET, free_port, fresh_database, wait_port  # noqa: E402

PAGE = (
    "<!DOCTYPE html><html><head><title>Page {n}</title>"
    "<script>var tracker = {n};</script><style>body {{ margin: 0 }}</style></head>"
    "<body><nav><a href='/'>Home</a> <a href='/news'>News</a></nav>"
    "<main><h1>Page {n}</h1>{paragraphs}</main><footer>Local site</footer></body></html>"
)
PARAGRAPH = "<p>Paragraph {k} of page {n}: the quick brown fox jumps over the lazy dog.</p>"


# -- the site (a separate process, so it does not share a GIL with either client) ----------


def page_body(n: int) -> bytes:
    paragraphs = "".join(PARAGRAPH.format(k=k, n=n) for k in range(12))
    return PAGE.format(n=n, paragraphs=paragraphs).encode()


async def serve_site(port: int, latency: float) -> None:
    bodies: dict[str, bytes] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                target = line.split(b" ")[1].decode("latin-1")
                etag_asked = None
                while True:
                    header = await reader.readline()
                    if header in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = header.partition(b":")
                    if name.strip().lower() == b"if-none-match":
                        etag_asked = value.strip().decode("latin-1")
                await asyncio.sleep(latency)
                if target.startswith("/p/"):
                    body = bodies.get(target)
                    if body is None:
                        body = bodies[target] = page_body(int(target[3:]))
                    etag = f'"{target[3:]}-v1"'
                    if etag_asked == etag:
                        head = f"HTTP/1.1 304 Not Modified\r\nETag: {etag}\r\n\r\n"
                        writer.write(head.encode())
                    else:
                        head = (
                            "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
                            f"Content-Length: {len(body)}\r\nETag: {etag}\r\n\r\n"
                        )
                        writer.write(head.encode() + body)
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (ConnectionError, IndexError, ValueError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def start_site(latency: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-site", str(port), "--latency", str(latency)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc, port


# -- the bare loop ------------------------------------------------------------------------


async def pages_per_s(
    urls: list[str], concurrency: int, fetch: Callable[[str], Awaitable[bool]], who: str
) -> float:
    """Pages per second of ``fetch`` (True: the page came) over ``urls``, ``concurrency``
    at a time; every page must come."""
    sem = asyncio.Semaphore(concurrency)
    ok = 0

    async def one(url: str) -> None:
        nonlocal ok
        async with sem:
            came = await fetch(url)  # not ``ok += await``: that reads ok before the wait
        ok += came

    started = time.perf_counter()
    await asyncio.gather(*(one(url) for url in urls))
    seconds = time.perf_counter() - started
    if ok != len(urls):
        raise SystemExit(f"{who}: {ok} of {len(urls)} pages fetched")
    return len(urls) / seconds


async def bare_loop(urls: list[str], concurrency: int) -> float:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, trust_env=False, timeout=30) as client:

        async def fetch(url: str) -> bool:
            response = await client.get(url)
            await response.aread()
            return response.status_code == 200

        return await pages_per_s(urls, concurrency, fetch, "bare loop")


# -- the fetcher against aiohttp (one process, no master, no database) --------------------


async def fetcher_loop(urls: list[str], concurrency: int) -> float:
    """Our fetcher as ``check_page`` uses it: guard, politeness, GET, bounded decoding, text."""
    from crawler_app.fetching.fetcher import Fetcher, FetchSettings

    settings = FetchSettings(
        allow_networks=("127.0.0.0/8",),
        per_host_in_flight=concurrency,
        per_host_interval=0,
        max_connections=concurrency,
    )
    async with Fetcher(settings) as fetcher:

        async def fetch(url: str) -> bool:
            result, _body = await fetcher.fetch_with_body(url, use_allowlist=True)
            return bool(result["ok"] and result["text"])

        return await pages_per_s(urls, concurrency, fetch, "fetcher")


async def aiohttp_loop(urls: list[str], concurrency: int) -> float:
    """The peer: one ``aiohttp.ClientSession``, bodies read, the same text extraction."""
    import aiohttp

    from crawler_app.fetching.fetch_settings import MAX_TEXT_CHARS
    from crawler_app.fetching.fetcher import text_fields

    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def fetch(url: str) -> bool:
            async with session.get(url) as response:
                body = await response.read()
                content_type = response.headers.get("Content-Type", "")
                fields = await text_fields(body, content_type, None, MAX_TEXT_CHARS)
                return response.status == 200 and bool(fields["text"])

        return await pages_per_s(urls, concurrency, fetch, "aiohttp")


def compare_fetchers(
    urls: list[str], concurrency: int, loop: str, rounds: int
) -> dict[str, tuple[float, float]]:
    """Our fetcher's and aiohttp's best pages per second and least CPU ms per page (this
    process: both are one process), ``rounds`` runs each, interleaved (who goes first
    alternates), on the agent's event loop. CPU per page is the steadier figure on a
    busy machine: it does not count the time another process held the core."""
    import aiohttp  # noqa: F401  (imported before the clock runs, as the fetcher is)

    import crawler_app.fetching.fetcher  # noqa: F401
    from jodl.agent import new_event_loop

    best = {"fetcher": (0.0, float("inf")), "aiohttp": (0.0, float("inf"))}
    for round_ in range(rounds):
        order = ("fetcher", "aiohttp") if round_ % 2 == 0 else ("aiohttp", "fetcher")
        for name in order:
            run = fetcher_loop if name == "fetcher" else aiohttp_loop
            with asyncio.Runner(loop_factory=partial(new_event_loop, loop)) as runner:
                cpu_before = time.process_time()
                rate = runner.run(run(urls, concurrency))
                cpu_ms = (time.process_time() - cpu_before) / len(urls) * 1000
            print(
                f"{name}, {loop}, {concurrency} in flight: {rate:.0f} pages/s, "
                f"{cpu_ms:.3f} ms CPU per page",
                flush=True,
            )
            best[name] = (max(best[name][0], rate), min(best[name][1], cpu_ms))
    return best


# -- the page checker -------------------------------------------------------------------------


def start_agent(
    concurrency: int, loop: str, confirm_delay: float | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JODL_")},
        "JODL_LOG_LEVEL": "WARNING",
        "JODL_SECRET": SECRET,
        "JODL_AGENT_ASYNC_SLOTS": str(concurrency),
        "JODL_AGENT_LOOP": loop,
        "JODL_FETCH_ALLOW": "127.0.0.0/8",
        "JODL_FETCH_HOST_IN_FLIGHT": str(concurrency),
        "JODL_FETCH_HOST_INTERVAL": "0",
        "JODL_FETCH_MAX_CONNECTIONS": str(concurrency),
    }
    if confirm_delay is not None:
        env["JODL_CONFIRM_DELAY"] = str(confirm_delay)
    # The master fills the agent's async slots (JODL_AGENT_ASYNC_SLOTS) for async
    # families such as check_page; the thread slots stay at their default.
    proc = subprocess.Popen(
        [sys.executable, "-m", "jodl", "agent", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_port(port)
    return proc, f"127.0.0.1:{port}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float:
    """CPU seconds used so far by all PostgreSQL server processes on this machine (Linux)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as fh:
                if fh.read().strip() != "postgres":
                    continue
            total += cpu_seconds(int(entry))
        except OSError:
            continue  # gone meanwhile
    return total


class StepClock:
    """CPU seconds of the agent, master, site and PostgreSQL during the check step."""

    def __init__(self, agent_pid: int, site_pid: int) -> None:
        self.pids = {"agent": agent_pid, "site": site_pid}
        self.start: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        now = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        now["master"] = time.process_time()
        now["postgres"] = postgres_cpu_seconds()
        return now

    def on_step(self, step: str) -> None:
        if step == "check":
            self.start = self._now()
        elif self.start and not self.used:
            now = self._now()
            self.used = {name: now[name] - self.start[name] for name in now}


def track_pages(engine: object, urls: list[str]) -> None:
    from sqlalchemy.orm import sessionmaker

    from crawler_app.models import Page, Tracking, User
    from crawler_app.users.pages import sync_jobs
    from jodl.log import utcnow

    with sessionmaker(engine)() as s, s.begin():  # type: ignore[call-overload]
        user = User(email="bench@example.org", created_at=utcnow())
        s.add(user)
        s.flush()
        pages = [Page(url=url, period=1, created_at=utcnow()) for url in urls]
        s.add_all(pages)
        s.flush()
        s.add_all(Tracking(user_id=user.id, page_id=p.id, since=utcnow()) for p in pages)
        s.flush()
        sync_jobs(s)


def run_page_checker(
    db_url: str,
    urls: list[str],
    concurrency: int,
    site_pid: int,
    loop: str,
    confirm_delay: float | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    from crawler_app.checking.cycle import PageCycle
    from crawler_app.settings import AppSettings
    from jodl import Master, Settings, Store, make_engine
    from jodl.log.migrate import upgrade

    engine = make_engine(db_url)
    upgrade(engine)
    track_pages(engine, urls)
    store = Store(engine)
    agent, address = start_agent(concurrency, loop, confirm_delay)
    try:
        store.add_node(address)
        settings = Settings(database_url=db_url, log_level="WARNING", secret=SECRET)
        app = AppSettings.from_env(env={}, check_spread=0.0, fetch_allow_users=("*",))
        figures = []
        for _ in range(2):
            master = Master(settings, store=store)
            clock = StepClock(agent.pid, site_pid)
            cpu_before = cpu_seconds(agent.pid)
            master_before = time.process_time()
            try:
                result = PageCycle(engine, master.run_cycle, app, on_step=clock.on_step).run()
            finally:
                master.close()
            agent_cpu = cpu_seconds(agent.pid) - cpu_before
            master_cpu = time.process_time() - master_before
            if result.checked != len(urls) or result.errors:
                raise SystemExit(f"page checker: {result.line()}")
            from sqlalchemy import select

            from crawler_app.models import AppCycle

            with engine.connect() as conn:
                timings = conn.scalar(select(AppCycle.timings).where(AppCycle.id == result.id))
            per_page = {f"check_{k}_cpu_ms": v / len(urls) * 1000 for k, v in clock.used.items()}
            figures.append(
                {
                    "check_s": timings["check"],
                    "cycle_s": result.elapsed,
                    "steps": timings,
                    "pages_per_s": len(urls) / timings["check"],
                    "not_modified": result.not_modified,
                    "agent_cpu_ms_per_page": agent_cpu / len(urls) * 1000,
                    "master_cpu_ms_per_page": master_cpu / len(urls) * 1000,
                    **per_page,
                    "check_cpu_sum": sum(per_page.values()),
                }
            )
    finally:
        agent.terminate()
        agent.wait(10)
        engine.dispose()
    return figures[0], figures[1]


def report(cold: dict[str, float], warm: dict[str, float]) -> None:
    print(
        f"check_page, full GETs: {cold['pages_per_s']:.0f} pages/s "
        f"(check {cold['check_s']:.2f}s, whole cycle {cold['cycle_s']:.2f}s, "
        f"CPU per page: agent {cold['agent_cpu_ms_per_page']:.2f} ms, "
        f"master {cold['master_cpu_ms_per_page']:.2f} ms)",
        flush=True,
    )
    print(
        f"check_page, all 304: {warm['pages_per_s']:.0f} pages/s "
        f"({warm['not_modified']} not modified, whole cycle {warm['cycle_s']:.2f}s)",
        flush=True,
    )
    for name, figures in (("full GETs", cold), ("all 304", warm)):
        shares = ", ".join(
            f"{k[6:-7]} {v:.3f}"
            for k, v in figures.items()
            if k.startswith("check_") and k.endswith("_cpu_ms")
        )
        print(
            f"CPU ms per page in the check step, {name}: {shares}, "
            f"sum {figures['check_cpu_sum']:.3f}; steps (s): {figures['steps']}",
            flush=True,
        )


def fetcher_figures(fetchers: dict[str, tuple[float, float]]) -> dict[str, float]:
    """The JSON figures of :func:`compare_fetchers`."""
    return {
        "fetcher_pages_per_s": round(fetchers["fetcher"][0]),
        "aiohttp_pages_per_s": round(fetchers["aiohttp"][0]),
        "ratio_aiohttp": round(fetchers["fetcher"][0] / fetchers["aiohttp"][0], 2),
        "fetcher_cpu_ms_per_page": round(fetchers["fetcher"][1], 3),
        "aiohttp_cpu_ms_per_page": round(fetchers["aiohttp"][1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=5000, help="pages checked (default 5000)")
    parser.add_argument("--latency", type=float, default=0.02, help="site latency, s (0.02)")
    parser.add_argument(
        "--concurrency", type=int, default=100, help="fetches in flight on the agent (100)"
    )
    parser.add_argument(
        "--database-url", default="sqlite", help="'sqlite' (a temp file) or a PostgreSQL URL"
    )
    parser.add_argument("--agent-loop", default="auto", help="the agent's JODL_AGENT_LOOP (auto)")
    parser.add_argument(
        "--confirm-delay",
        type=float,
        default=None,
        help="the agent's JODL_CONFIRM_DELAY (default: the product's); a new page's "
        "baseline takes two fetches this far apart",
    )
    parser.add_argument(
        "--fetcher-rounds",
        type=int,
        default=5,
        help="runs each of our fetcher and aiohttp, interleaved; the best counts (5)",
    )
    parser.add_argument(
        "--fetchers-only",
        action="store_true",
        help="only compare our fetcher with aiohttp (no page checker, no bare httpx loop)",
    )
    parser.add_argument("--serve-site", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_site is not None:
        asyncio.run(serve_site(args.serve_site, args.latency))
        return

    from jodl.agent import loop_name, new_event_loop

    agent_loop = loop_name(new_event_loop(args.agent_loop))
    site, port = start_site(args.latency)
    if args.fetchers_only:
        try:
            urls = [f"http://127.0.0.1:{port}/p/{i}" for i in range(args.pages)]
            fetchers = compare_fetchers(urls, args.concurrency, agent_loop, args.fetcher_rounds)
        finally:
            site.terminate()
            site.wait(10)
        print(
            json.dumps(
                {
                    "pages": args.pages,
                    "concurrency": args.concurrency,
                    "agent_loop": agent_loop,
                    **fetcher_figures(fetchers),
                }
            )
        )
        return
    # The bare loop is run at the same concurrency and at 20, 50 and 100 (httpx's pool
    # slows down as it grows), on asyncio's loop and on uvloop's when installed, before
    # and after the page checker; its best run is the peer.
    bare_levels = sorted({args.concurrency, 20, 50, 100})
    bare_loops = sorted({"asyncio", loop_name(new_event_loop("auto"))})
    bare: dict[tuple[str, int], float] = {}
    try:
        urls = [f"http://127.0.0.1:{port}/p/{i}" for i in range(args.pages)]
        for when in ("", " (after)"):
            if when:
                with fresh_database(args.database_url) as db_url:
                    cold, warm = run_page_checker(
                        db_url,
                        urls,
                        args.concurrency,
                        site.pid,
                        args.agent_loop,
                        args.confirm_delay,
                    )
                report(cold, warm)
            for loop in bare_loops:
                for level in bare_levels:
                    with asyncio.Runner(loop_factory=partial(new_event_loop, loop)) as runner:
                        rate = runner.run(bare_loop(urls, level))
                    print(f"bare loop, {loop}, {level} in flight{when}: {rate:.0f} pages/s")
                    bare[loop, level] = max(bare.get((loop, level), 0.0), rate)
        fetchers = compare_fetchers(urls, args.concurrency, agent_loop, args.fetcher_rounds)
    finally:
        site.terminate()
        site.wait(10)
    best_loop, best_level = max(bare, key=bare.__getitem__)
    best = bare[best_loop, best_level]
    print(
        json.dumps(
            {
                "pages": args.pages,
                "latency_ms": round(args.latency * 1000, 1),
                "concurrency": args.concurrency,
                "pages_per_s": round(cold["pages_per_s"]),
                "pages_per_s_304": round(warm["pages_per_s"]),
                "bare_httpx_pages_per_s": round(best),
                "bare_httpx_concurrency": best_level,
                "bare_httpx_loop": best_loop,
                "bare_httpx_same_concurrency_pages_per_s": round(
                    max(bare[loop, args.concurrency] for loop in bare_loops)
                ),
                "agent_loop": agent_loop,
                "ratio": round(cold["pages_per_s"] / best, 2),
                "agent_cpu_ms_per_page": round(cold["agent_cpu_ms_per_page"], 2),
                "master_cpu_ms_per_page": round(cold["master_cpu_ms_per_page"], 2),
                "check_cpu_ms_per_page": {
                    k[6:-7]: round(v, 3)
                    for k, v in cold.items()
                    if k.startswith("check_") and k.endswith("_cpu_ms")
                },
                "check_cpu_ms_per_page_sum": round(cold["check_cpu_sum"], 3),
                "check_cpu_ms_per_page_sum_304": round(warm["check_cpu_sum"], 3),
                "cycle_s": round(cold["cycle_s"], 2),
                "cycle_304_s": round(warm["cycle_s"], 2),
                **fetcher_figures(fetchers),
            }
        )
    )


if __name__ == "__main__":
    main()
