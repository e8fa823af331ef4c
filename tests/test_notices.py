"""Notices of ended on-demand jobs (jodl.log.notices) and the event streams they wake.

On PostgreSQL a commit that ends a claim NOTIFYs its job ids and the watch's
listening thread wakes the waiters of those jobs only; on SQLite the same commit
wakes the watches of its own process, which count as live only while a writer of
on-demand outcomes (a master's queue feeder) runs here. An open batch stream then
queries the log when woken and not on a clock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from jodl.log import ResultWatch, Store
from jodl.log.notices import HERE, PAYLOAD_MAX, announce, begin
from jodl.queue import Queue, QueueFeeder
from tests.test_web_batch import URL, parse, result
from web.settings import WebSettings

FAMILY = "noop"


def wait_until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


@contextlib.contextmanager
def live(watch: ResultWatch) -> Iterator[None]:
    """The watch hears of commits: its listener is up (PostgreSQL), or a writer of
    on-demand outcomes runs in this process (SQLite)."""
    with contextlib.ExitStack() as stack:
        if not watch.postgres:
            stack.enter_context(HERE.writing(watch.engine))
        watch.subscribe(()).close()  # starts the listening thread
        assert wait_until(lambda: watch.live), "the watch never went live"
        yield


@pytest.fixture
def watch(store: Store) -> Iterator[ResultWatch]:
    w = ResultWatch(store.engine)
    yield w
    w.close()


def claimed(queue: Queue, *keys: str) -> dict[str, Any]:
    store = queue.store
    store.ensure_family(FAMILY)
    for key in keys:
        queue.enqueue(FAMILY, key, {"k": key})
    got = queue.claim(len(keys), families=[FAMILY])
    assert sorted(c.key for c in got) == sorted(keys)
    return {c.key: c for c in got}


def test_an_ended_job_wakes_its_waiters_only(store: Store, watch: ResultWatch) -> None:
    queue = Queue(store)
    jobs = claimed(queue, "a", "b", "c")
    with live(watch):
        a = watch.subscribe([jobs["a"].id])
        b = watch.subscribe([jobs["b"].id])
        both = watch.subscribe([jobs["a"].id, jobs["c"].id])
        assert not a.wait(0.05)
        assert queue.complete(jobs["a"].id, jobs["a"].attempt, {"ok": True})
        assert a.wait(5) and both.wait(5)
        assert not b.wait(0.3), "a notice woke a waiter of another job"
        # A failure ends the claim too (the job is queued again, or dead): waiters look.
        assert queue.fail(jobs["b"].id, jobs["b"].attempt, "boom") is not None
        assert b.wait(5)
        # A waiter that no longer waits for a job is not woken by it.
        both.keep([jobs["a"].id])
        assert queue.complete(jobs["c"].id, jobs["c"].attempt, {"ok": True})
        assert not both.wait(0.3)
        for sub in (a, b, both):
            sub.close()
    queue.close()


def test_sqlite_watch_is_live_only_beside_a_writer(store: Store, watch: ResultWatch) -> None:
    if watch.postgres:
        assert not watch.live  # nothing listens before the first subscription
        watch.subscribe(()).close()
        assert wait_until(lambda: watch.live)
        return
    watch.subscribe(()).close()
    assert not watch.live, "no writer in this process: waiters must poll"
    queue = Queue(store)
    feeder = QueueFeeder(queue)
    assert watch.live, "a master's queue feeder writes on-demand outcomes here"
    feeder.close()
    assert not watch.live


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_long_notices_are_split(store: Store, watch: ResultWatch) -> None:
    ids = list(range(10**9, 10**9 + 2 * PAYLOAD_MAX // 10))  # two payloads and more
    with live(watch):
        first, last = watch.subscribe([ids[0]]), watch.subscribe([ids[-1]])
        with begin(store.engine) as conn:
            announce(conn, ids)
        assert first.wait(5) and last.wait(5)


def test_closing_wakes_every_waiter(watch: ResultWatch) -> None:
    with live(watch):
        sub = watch.subscribe([1])
        closing = threading.Timer(0.1, watch.close)
        closing.start()
        started = time.monotonic()
        assert sub.wait(5)
        assert time.monotonic() - started < 4
        closing.join()
        assert not watch.live
        assert watch.subscribe([2]).wait(0), "a closed watch never makes anyone wait"


def test_an_idle_stream_queries_nothing_until_its_result(store: Store) -> None:
    """A stream with a pending item makes no query while nothing happens (only the rare
    safety look), and its result goes out when committed, long before a poll would."""
    from web.app import create_app

    settings = WebSettings(
        database_url="unused",
        web_secure_cookies=False,
        web_stream_poll=30.0,  # would be the pause if the stream polled
        web_stream_seconds=60,
    )
    app = create_app(settings, engine=store.engine)
    svc = app.extensions["jodl"]
    sub = svc.batches.submit([URL])
    queue = svc.batches.queue
    chunks: list[tuple[float, str]] = []
    with live(svc.results):
        response = app.test_client().get(f"/api/batches/{sub.id}/events", buffered=False)

        def read() -> None:
            for chunk in response.response:
                chunks.append((time.monotonic(), chunk.decode()))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert wait_until(lambda: chunks), "the stream did not start"
        time.sleep(0.3)  # its first look at the log
        queries: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            queries.append(statement)

        event.listen(store.engine, "before_cursor_execute", count)
        try:
            time.sleep(1.0)
        finally:
            event.remove(store.engine, "before_cursor_execute", count)
        assert queries == [], "an idle stream queried the database"
        (job,) = queue.claim(1, families=["check_page"])
        committed = time.monotonic()
        assert queue.complete(job.id, job.attempt, result(URL))
        reader.join(10)
        assert not reader.is_alive(), "the stream did not end"
        svc.stopping.set()
    events = parse("".join(c for _, c in chunks))
    assert [e["event"] for e in events] == ["result", "complete"]
    arrived = next(t for t, c in chunks if "event: result" in c)
    assert arrived - committed < 5.0, "the result waited for a poll"
