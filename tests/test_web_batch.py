"""Batches, the result cache and resets on a real database (SQLite and PostgreSQL).

Results are committed the way the queue commits them (claim, then complete with
a result), so no agent is needed here; ``test_sse.py`` runs the real thing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from jodl.log import Store
from jodl.log.models import utcnow
from jodl.queue import Queue
from tests.clock import Clock
from web.batch import KEY_PREFIX, Batches, SubmissionError, check_url, split_urls
from web.settings import WebSettings
from web.stream import Cursor

URL = "http://pages.example/a"


@pytest.fixture
def clock() -> Clock:
    return Clock(utcnow())


@pytest.fixture
def batches(store: Store, clock: Clock) -> Iterator[Batches]:
    settings = WebSettings(database_url="unused", web_cache_ttl=60.0, web_refresh_fraction=0.0)
    b = Batches(store.engine, settings, Queue(store), rng=lambda: 0.5, clock=clock)
    yield b


def result(url: str, text: str = "hello", ok: bool = True, status: int = 200) -> dict[str, Any]:
    from crawler_app.fetching.text import fingerprint

    out: dict[str, Any] = {
        "url": url,
        "final_url": url,
        "status": status,
        "ok": ok,
        "title": "Title of " + url,
        "size": len(text),
    }
    if ok:
        out["views"] = {"": {"fingerprint": fingerprint(text), "chars": len(text), "text": text}}
    else:
        out.update(error="http_error", error_message=f"the server answered {status}")
    return out


def finish(queue: Queue, url: str, res: dict[str, Any], *more: tuple[str, dict[str, Any]]) -> None:
    """Claim the queued jobs and complete those URLs' with their results (as a master would).

    Every queued job must be one of them (a claimed job left over would stay claimed).
    """
    wanted = {KEY_PREFIX + url: res, **{KEY_PREFIX + u: r for u, r in more}}
    claimed = queue.claim(100, families=["check_page"])
    assert sorted(c.key for c in claimed) == sorted(wanted), "queued jobs differ"
    by_key = {c.key: c for c in claimed}
    for key, res_ in wanted.items():  # committed in the order given
        assert queue.complete(by_key[key].id, by_key[key].attempt, res_)


def test_url_checks() -> None:
    assert check_url("  HTTP://Example.ORG:80/a#frag ", 2048) == "http://example.org/a"
    for bad, why in [
        ("ftp://example.org/", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("http://user:pw@example.org/", "credentials"),
        ("http://0x7f.1/", "IPv4"),
        ("http://example.org/" + "a" * 3000, "longer"),
        ("", "empty"),
    ]:
        with pytest.raises(ValueError, match=why):
            check_url(bad, 2048)
    assert split_urls("a\n\n  b  \r\nc") == ["a", "b", "c"]


def test_new_urls_are_queued_once_and_answered_by_their_result(batches: Batches) -> None:
    sub = batches.submit(
        [URL, "ftp://nope", "HTTP://Pages.Example:80/a#x", "http://pages.example/b"]
    )
    assert sub.refused == 1 and sub.queued == 2 and sub.duplicates == 1 and sub.cached == 0
    assert [i.url for i in sub.items] == [URL, "ftp://nope", "http://pages.example/b"]
    counts = batches.queue.counts("check_page")["check_page"]
    assert counts["queued"] == 2
    _, items = batches.load(sub.id)  # type: ignore[misc]
    events = batches.immediate(items)
    assert [e["position"] for e in events] == [1]
    assert "scheme" in events[0]["error"]
    pending = [i for i in items if i.pending]
    assert batches.arrived(pending) == []
    b = "http://pages.example/b"
    finish(batches.queue, b, result(b, "bee"), (URL, result(URL)))
    arrived = batches.arrived(pending)
    # In commit order: b's result was committed first.
    assert [(i.position, e["excerpt"], e["ok"], e["cached"]) for i, e in arrived] == [
        (2, "bee", True, False),
        (0, "hello", True, False),
    ]
    assert arrived[0][1]["changed"] is None  # no earlier result to compare with


def test_cache_answers_good_results_and_requeues_errors(batches: Batches, clock: Clock) -> None:
    bad = "http://pages.example/broken"
    batches.submit([URL, bad])
    finish(batches.queue, URL, result(URL), (bad, result(bad, ok=False, status=503)))
    sub = batches.submit([URL, bad])
    assert sub.cached == 1 and sub.queued == 1
    by_url = {e["url"]: e for e in batches.immediate(sub.items)}
    assert by_url[URL]["ok"] and by_url[URL]["cached"] and by_url[URL]["excerpt"] == "hello"
    # The error answers nothing: it is queued again and waits for its fresh result.
    assert bad not in by_url
    queued = {j.key for j in batches.queue.jobs("check_page", state="queued")}
    assert queued == {KEY_PREFIX + bad}
    finish(batches.queue, bad, result(bad, ok=False, status=503))
    # Past the TTL the good result no longer answers: queued, and compared when it comes.
    clock.advance(61)
    sub = batches.submit([URL])
    assert sub.cached == 0 and sub.queued == 1
    finish(batches.queue, URL, result(URL, "hello again"))
    ((_, event),) = batches.arrived(sub.items)
    assert event["changed"] is True and event["excerpt"] == "hello again"


def test_a_cached_refusal_waits_for_its_fresh_result(batches: Batches) -> None:
    # Refused once (a network not allowed yet); allowed since: resubmitting must not
    # show the old refusal as a final "(cached)" answer, but the fresh result.
    refused = result(URL, ok=False, status=0)
    refused.update(status=None, error="refused", error_message="loopback address refused")
    batches.submit([URL])
    finish(batches.queue, URL, refused)
    sub = batches.submit([URL])
    assert sub.cached == 0 and sub.queued == 1
    _, items = batches.load(sub.id)  # type: ignore[misc]
    assert batches.immediate(items) == []
    (item,) = items
    assert item.pending
    assert batches.arrived(items) == []  # the batch is not complete yet
    finish(batches.queue, URL, result(URL, "allowed now"))
    ((_, event),) = batches.arrived(items)
    assert event["ok"] and not event["cached"] and event["excerpt"] == "allowed now"


def test_refresh_fraction_requeues_cached_good_results(store: Store, clock: Clock) -> None:
    settings = WebSettings(database_url="unused", web_cache_ttl=60.0, web_refresh_fraction=0.5)
    draws = iter([0.9, 0.1])
    b = Batches(store.engine, settings, Queue(store), rng=lambda: next(draws), clock=clock)
    b.submit([URL])
    finish(b.queue, URL, result(URL))
    first = b.submit([URL])  # draw 0.9: not refreshed
    assert first.cached == 1 and first.refreshed == 0
    assert not b.queue.jobs("check_page", state="queued")
    second = b.submit([URL])  # draw 0.1 < 0.5: answered from the cache and queued again
    assert second.cached == 1 and second.refreshed == 1
    assert [j.key for j in b.queue.jobs("check_page", state="queued")] == [KEY_PREFIX + URL]


def test_running_job_is_not_queued_twice(batches: Batches) -> None:
    batches.submit([URL])
    claimed = batches.queue.claim(10, families=["check_page"])
    sub = batches.submit([URL])
    assert sub.queued == 1
    job = batches.queue.get("check_page", KEY_PREFIX + URL)
    assert job is not None and job.state == "claimed" and job.due_at is None
    batches.queue.complete(claimed[0].id, claimed[0].attempt, result(URL))
    assert [i.position for i, _ in batches.arrived(sub.items)] == [0]
    assert batches.queue.get("check_page", KEY_PREFIX + URL).state == "done"  # type: ignore[union-attr]


def test_reset_forgets_results(batches: Batches) -> None:
    batches.submit([URL])
    finish(batches.queue, URL, result(URL))
    assert batches.submit([URL]).cached == 1
    out = batches.reset([URL, "http://pages.example/never", "gopher://x"], user_id=None)
    assert out["forgotten"] == [URL]
    assert out["unknown"] == ["http://pages.example/never"]
    assert out["refused"][0]["url"] == "gopher://x"
    sub = batches.submit([URL])
    assert sub.cached == 0 and sub.queued == 1
    # The forgotten result does not answer the new submission either.
    assert batches.arrived(sub.items) == []
    finish(batches.queue, URL, result(URL, "fresh"))
    ((_, event),) = batches.arrived(sub.items)
    assert event["excerpt"] == "fresh" and event["changed"] is None
    assert batches.reset([URL])["forgotten"] == [URL]
    assert batches.reset([URL])["forgotten"] == []  # nothing new to forget


def test_dead_job_is_answered_with_its_error(batches: Batches) -> None:
    sub = batches.submit([URL])
    claimed = batches.queue.claim(10, families=["check_page"])
    assert batches.queue.fail(claimed[0].id, claimed[0].attempt, "agent exploded", retryable=False)
    ((_, event),) = batches.given_up(sub.items)
    assert event["error"] == "gave up: agent exploded" and not event["ok"]


def test_submission_limits(batches: Batches) -> None:
    with pytest.raises(SubmissionError, match="no URL"):
        batches.submit([])
    with pytest.raises(SubmissionError, match="at most 100"):
        batches.submit([f"http://e.example/{i}" for i in range(101)])
    with pytest.raises(SubmissionError, match="list"):
        batches.submit("http://e.example/")  # type: ignore[arg-type]
    sub = batches.submit([123, None, "http://e.example/"])  # type: ignore[list-item]
    assert [i.error for i in sub.items] == ["not a string", "not a string", None]
    assert batches.load("nope") is None and batches.load("x" * 500) is None


def test_cursor_round_trip_and_garbage() -> None:
    cursor = Cursor(20)
    for p in (0, 3, 19):
        cursor.add(p)
    again = Cursor.parse(cursor.text(), 20)
    assert again.delivered == {0, 3, 19} and not again.complete
    for junk in ("", "x", "3-", "2-AAAA", "1-//", "99-" + "A" * 5, "1-\x00", "3-" + "Z" * 400):
        assert Cursor.parse(junk, 20).delivered == set()
    assert Cursor.parse(cursor.text(), 10).delivered == set()  # a position past the batch
    full = Cursor(3, {0, 1, 2})
    assert Cursor.parse(full.text(), 3).complete


def test_stream_sends_answers_and_resumes(store: Store, batches: Batches) -> None:
    """The event generator over the Flask test client (HTTP streams: test_sse.py)."""
    from web.app import create_app

    settings = WebSettings(
        database_url="unused", web_secure_cookies=False, web_stream_poll=0.01, web_stream_seconds=5
    )
    app = create_app(settings, engine=store.engine)
    svc = app.extensions["jodl"]
    sub = svc.batches.submit([URL, "ftp://x"])
    finish(svc.batches.queue, URL, result(URL, "<script>alert(1)</script>"))
    client = app.test_client()
    body = client.get(f"/batches/{sub.id}/events").get_data(as_text=True)
    events = parse(body)
    assert [e["event"] for e in events] == ["result", "result", "complete"]
    assert [json.loads(e["data"])["position"] for e in events[:2]] == [1, 0]
    assert json.loads(events[1]["data"])["excerpt"] == "<script>alert(1)</script>"
    # Resume after the first event: only the second, then complete.
    again = parse(
        client.get(
            f"/api/batches/{sub.id}/events", headers={"Last-Event-ID": events[0]["id"]}
        ).get_data(as_text=True)
    )
    assert [e["event"] for e in again] == ["result", "complete"]
    assert json.loads(again[0]["data"])["position"] == 0
    # Resume after everything: complete at once.
    done = parse(
        client.get(f"/batches/{sub.id}/events?last_event_id={events[-1]['id']}").get_data(
            as_text=True
        )
    )
    assert [e["event"] for e in done] == ["complete"]
    assert client.get("/batches/nope/events").status_code == 404


def parse(body: str) -> list[dict[str, str]]:
    """SSE text -> events (comments and retry lines skipped)."""
    out = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "event" in fields:
            out.append(fields)
    return out
