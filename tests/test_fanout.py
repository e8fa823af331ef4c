"""The fan-out of new results to open batch streams (web/fanout.py), on SQLite and PostgreSQL.

Streams are read over the Flask test client, unbuffered, each in a thread of its own;
results are committed the way the queue commits them (claim, then complete), each
complete a commit of its own that announces its job. The streams' polling interval
is far longer than any test: what reaches them was pushed. Checked: many streams of
different users each get exactly their own results once, in commit order; a stream
resumed with Last-Event-ID gets exactly what it missed; waiting streams query
nothing; one notice for N streams is one look at the log; a stream whose client
stops reading holds a bounded inbox and catches up from the database.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Engine, event
from sqlalchemy.orm import sessionmaker

from crawler_app.fetching.reach import Reach
from crawler_app.users.pages import add_user
from jodl.log import Store
from jodl.queue import Queue
from tests.test_notices import live, wait_until
from tests.test_web_batch import parse, result
from web import fanout
from web.app import Services, create_app
from web.settings import WebSettings

SITE = "http://pages.example"


@pytest.fixture
def app(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    # No safety look during a test: every look it sees comes from a notice.
    monkeypatch.setattr(fanout, "SAFETY_POLL", 300.0)
    settings = WebSettings(
        database_url="unused",
        web_secure_cookies=False,
        web_stream_poll=300.0,  # a stream answered in a test was pushed, never polled
        web_stream_seconds=300,
        web_max_streams=20,
        web_streams_per_client=20,
        web_threads=32,
    )
    app = create_app(settings, engine=store.engine)
    svc: Services = app.extensions["jodl"]
    with live(svc.results):
        yield app
    svc.stopping.set()


class Reader:
    """One stream read to its end in a thread of its own; its events as they come."""

    def __init__(self, app: Flask, batch_id: str, last_event_id: str | None = None) -> None:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        self.response = app.test_client().get(
            f"/api/batches/{batch_id}/events", headers=headers, buffered=False
        )
        self.text = ""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for chunk in self.response.response:
            self.text += chunk.decode()

    def events(self) -> list[dict[str, str]]:
        return parse(self.text)

    def results(self) -> list[dict[str, Any]]:
        return [json.loads(e["data"]) for e in self.events() if e["event"] == "result"]

    def join(self) -> list[dict[str, str]]:
        self.thread.join(15)
        assert not self.thread.is_alive(), "the stream did not end"
        return self.events()


class Statements:
    """SELECTs on the execution log made by threads other than the test's own."""

    def __init__(self) -> None:
        self.test_thread = threading.get_ident()
        self.seen: list[tuple[int, str]] = []
        self.lock = threading.Lock()

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if threading.get_ident() != self.test_thread:
            with self.lock:
                self.seen.append((threading.get_ident(), statement))

    def __enter__(self) -> Statements:
        # Every engine of this process: the app's and the fan-out's own connection.
        event.listen(Engine, "before_cursor_execute", self)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(Engine, "before_cursor_execute", self)


def users(store: Store, count: int) -> list[int]:
    with sessionmaker(store.engine, expire_on_commit=False).begin() as s:
        return [add_user(s, f"user{n}@example.org").id for n in range(count)]


def claim_all(queue: Queue, count: int) -> dict[int, Any]:
    claimed = queue.claim(count + 10, families=["check_page"])
    assert len(claimed) == count
    return {c.id: c for c in claimed}


def test_streams_of_many_users_get_their_own_results_once_in_commit_order(
    app: Flask, store: Store
) -> None:
    svc: Services = app.extensions["jodl"]
    people = users(store, 4)
    shared = f"{SITE}/shared"
    batches = []
    for n in range(6):
        # The shared URL: one job for the public submissions, another for those that may
        # use the allowlist (web.batch.KEY_PREFIXES); each stream must get its own job's.
        reach = Reach.ALLOWLIST if n >= 4 else Reach.PUBLIC
        urls = [f"{SITE}/{n}/{k}" for k in range(3)] + [shared]
        batches.append(svc.batches.submit(urls, user_id=people[n % 4], reach=reach))
    readers = [Reader(app, b.id) for b in batches]
    claimed = claim_all(svc.batches.queue, 6 * 3 + 2)
    order = list(claimed)
    random.Random(7).shuffle(order)
    for jid in order:
        job = claimed[jid]
        text = "allowlisted" if job.key.startswith("web-allowlist:") else f"text of {job.key}"
        assert svc.batches.queue.complete(jid, job.attempt, result(job.key, text))
    rank = {jid: n for n, jid in enumerate(order)}
    for batch, reader in zip(batches, readers, strict=True):
        events = reader.join()
        assert [e["event"] for e in events] == ["result"] * 4 + ["complete"]
        got = [json.loads(e["data"]) for e in events[:-1]]
        assert sorted(r["position"] for r in got) == [0, 1, 2, 3]  # each once
        jobs = {i.position: i.job_id for i in batch.items}
        assert [rank[jobs[r["position"]]] for r in got] == sorted(
            rank[jid] for jid in jobs.values()
        ), "not in commit order"
        allowlisted = batch is batches[4] or batch is batches[5]
        for r in got:  # the result of its own job, never the other reach's
            assert r["excerpt"] == ("allowlisted" if allowlisted else f"text of web:{r['url']}")
    assert wait_until(lambda: svc.fanout.waiting == 0), "an ended stream left its inbox"


def test_resume_with_last_event_id_gets_exactly_what_was_missed(app: Flask) -> None:
    svc: Services = app.extensions["jodl"]
    batch = svc.batches.submit([f"{SITE}/r/{k}" for k in range(5)])
    queue = svc.batches.queue
    claimed = claim_all(queue, 5)
    jobs = [i.job_id for i in batch.items]

    def complete(position: int) -> None:
        job = claimed[jobs[position]]
        assert queue.complete(job.id, job.attempt, result(job.key))

    complete(3)
    complete(0)  # both before the stream opens: its own first look sends them
    response = app.test_client().get(f"/api/batches/{batch.id}/events", buffered=False)
    chunks = iter(response.response)
    text = ""
    while len([e for e in parse(text) if e["event"] == "result"]) < 2:
        text += next(chunks).decode()
    complete(1)  # pushed to the open stream
    while len([e for e in parse(text) if e["event"] == "result"]) < 3:
        text += next(chunks).decode()
    first = parse(text)
    assert [json.loads(e["data"])["position"] for e in first] == [3, 0, 1]
    response.close()  # the client goes away: its inbox with it
    assert wait_until(lambda: svc.fanout.waiting == 0)
    complete(4)
    complete(2)
    again = Reader(app, batch.id, last_event_id=first[-1]["id"])
    rest = again.join()
    assert [e["event"] for e in rest] == ["result", "result", "complete"]
    assert [json.loads(e["data"])["position"] for e in rest[:2]] == [4, 2]
    # Nothing twice, nothing lost: the two parts make the batch.
    seen = [json.loads(e["data"])["position"] for e in first + rest[:2]]
    assert sorted(seen) == [0, 1, 2, 3, 4]


def test_one_notice_for_many_streams_is_one_look_and_waiting_costs_nothing(
    app: Flask, store: Store
) -> None:
    svc: Services = app.extensions["jodl"]
    people = users(store, 8)
    url = f"{SITE}/popular"
    with Statements() as statements:
        # Eight users wait for the same URL: one job, eight streams.
        batches = [svc.batches.submit([url], user_id=p) for p in people]
        assert len({b.items[0].job_id for b in batches}) == 1
        readers = [Reader(app, b.id) for b in batches]
        # Registered; the fan-out's first look for them made; now they wait.
        assert wait_until(lambda: svc.fanout.waiting == 8 and not svc.fanout.busy)
        before = len(statements.seen)
        looks = svc.fanout.looks
        time.sleep(1.0)  # a while of waiting: no stream asks the database anything
        assert statements.seen[before:] == [], "a waiting stream queried the database"
        (job,) = claim_all(svc.batches.queue, 1).values()
        assert svc.batches.queue.complete(job.id, job.attempt, result(url))
        for reader in readers:
            assert [e["event"] for e in reader.join()] == ["result", "complete"]
        after = [s for _, s in statements.seen[before:] if "FROM jodl_execution" in s]
    assert svc.fanout.looks == looks + 1
    assert len(after) == 1, f"one notice for 8 streams made {len(after)} looks"


def test_a_stream_that_stops_reading_holds_a_bounded_inbox_then_catches_up(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "INBOX_MAX", 2)
    svc: Services = app.extensions["jodl"]
    batch = svc.batches.submit([f"{SITE}/slow/{k}" for k in range(6)])
    queue = svc.batches.queue
    claimed = claim_all(queue, 6)
    jobs = [i.job_id for i in batch.items]

    def complete(position: int) -> None:
        job = claimed[jobs[position]]
        assert queue.complete(job.id, job.attempt, result(job.key))

    complete(0)
    response = app.test_client().get(f"/api/batches/{batch.id}/events", buffered=False)
    chunks = iter(response.response)
    text = ""
    while not any(e["event"] == "result" for e in parse(text)):
        text += next(chunks).decode()
    # Registered and waiting; now the client stops reading while five results commit.
    assert wait_until(lambda: svc.fanout.waiting == 1)
    for position in (5, 1, 4, 2, 3):
        complete(position)
    assert wait_until(lambda: _behind(svc)), "a full inbox was not marked behind"
    with svc.fanout._lock:
        held = [len(i.answers) for w in svc.fanout._by_job.values() for i in w]
    assert held and max(held) <= 2
    for chunk in chunks:
        text += chunk.decode()
    events = parse(text)
    assert [e["event"] for e in events] == ["result"] * 6 + ["complete"]
    positions = [json.loads(e["data"])["position"] for e in events[:-1]]
    assert positions == [0, 5, 1, 4, 2, 3]  # each once, in commit order
    response.close()


def _behind(svc: Services) -> bool:
    with svc.fanout._lock:
        return any(i.behind for w in svc.fanout._by_job.values() for i in w)
