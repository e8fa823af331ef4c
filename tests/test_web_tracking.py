"""Tracked pages through Flask's test client: "Check now", the next check, readable times."""

from __future__ import annotations

import datetime as dt
import re

import lxml.html
import pytest
import test_web_views
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from test_web_views import assert_safe, login, make_user, text_of, token
from tzlocal import get_localzone

from crawler_app.checking import baselines
from crawler_app.fetching.reach import Reach
from crawler_app.models import Page
from crawler_app.users.pages import sync_jobs, track
from jodl.log.models import utcnow
from web.batch import KEY_PREFIXES

# The views' fixtures: a fresh app and database per test, a user and an operator logged in.
app = test_web_views.app
user_client = test_web_views.user_client
admin_client = test_web_views.admin_client

URL = "http://news.example/"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")


def tracked_page(app: Flask, email: str, checked: dt.datetime | None = None) -> int:
    sessions = sessionmaker(app.extensions["jodl"].engine)
    with sessions.begin() as s:
        page_id = track(s, email, URL).page_id
        page = s.get(Page, page_id)
        assert page is not None
        page.last_checked_at = checked
        page.last_status = 200 if checked else None
        s.flush()
        sync_jobs(s, [page_id])  # its due time counts from that check, as after a cycle
        return page_id


def queued(app: Flask) -> set[str]:
    return {j.key for j in app.extensions["jodl"].queue.jobs("check_page", state="queued")}


def finish_all(app: Flask, text: str) -> None:
    """Complete every queued check with a good result (as a master would)."""
    queue = app.extensions["jodl"].queue
    for job in queue.claim(100, families=["check_page"]):
        res = {"url": URL, "final_url": URL, "status": 200, "ok": True, "title": text}
        assert queue.complete(job.id, job.attempt, res)


def test_check_now_fetches_a_tracked_page_afresh(
    app: Flask, user_client: FlaskClient, admin_client: FlaskClient
) -> None:
    page_id = tracked_page(app, "user@example.org")
    app.extensions["jodl"].batches.rng = lambda: 1.0  # no random re-check of cached results
    # A fresh good result in the cache: an ordinary submission is answered from it (one
    # of the user's, whose jobs may use the fetch allowlist in tests)...
    mine = Reach.ALLOWLIST
    app.extensions["jodl"].batches.submit([URL], reach=mine)
    finish_all(app, "cached")
    assert app.extensions["jodl"].batches.submit([URL], reach=mine).cached == 1
    assert queued(app) == set()
    # ... "Check now" is not: it fetches the page and its batch waits for that result.
    doc = assert_safe(user_client.get("/pages").get_data(as_text=True))
    (form,) = doc.xpath("//form[contains(@class, 'check-now')]")
    assert form.get("action") == f"/pages/{page_id}/check"
    r = user_client.post(form.get("action"), data={"csrf_token": token(user_client, "/pages")})
    assert r.status_code == 303 and r.headers["Location"].startswith("/batches/")
    # The page has no baseline yet: its baseline check is queued too.
    assert queued(app) == {KEY_PREFIXES[mine] + URL, baselines.KEY_PREFIX + URL}
    batch_id = r.headers["Location"].rsplit("/", 1)[1]
    _, items = app.extensions["jodl"].batches.load(batch_id)  # type: ignore[misc]
    assert [i.pending for i in items] == [True]
    finish_all(app, "fresh")
    ((_, event),) = app.extensions["jodl"].batches.arrived(items)
    assert event["title"] == "fresh" and not event["cached"]
    page = user_client.get(r.headers["Location"])
    assert page.status_code == 200 and URL in page.get_data(as_text=True)

    # Operators may check any page; other users may not check a page they do not track.
    r = admin_client.post(f"/pages/{page_id}/check", data={"csrf_token": token(admin_client)})
    assert r.status_code == 303
    make_user(app, "other@example.org")
    other = app.test_client()
    login(other, "other@example.org")
    r = other.post(f"/pages/{page_id}/check", data={"csrf_token": token(other)})
    assert r.status_code == 404
    r = user_client.post(f"/pages/{page_id}/check", data={"csrf_token": "forged"})
    assert r.status_code == 403
    assert user_client.get(f"/pages/{page_id}/check").status_code == 405


def test_tracked_pages_show_readable_times_and_the_next_check(
    app: Flask, user_client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JODL_SCHEDULE", "0 6 * * *")
    monkeypatch.setenv("JODL_CHECK_SPREAD", "0")
    checked = utcnow().replace(microsecond=0) - dt.timedelta(minutes=3)
    tracked_page(app, "user@example.org", checked)
    doc = assert_safe(user_client.get("/pages").get_data(as_text=True))
    (row,) = doc.xpath("//table[@id='tracked']/tbody/tr")
    # No raw ISO text: times are <time> elements with the instant in an attribute.
    assert not ISO.search(text_of(row))
    (last,) = row.xpath(".//td[@class='last-check']/time")
    assert last.get("datetime") == checked.isoformat() + "Z"
    assert last.text == checked.strftime("%d %b %Y, %H:%M UTC")
    # The next check: the next 06:00 of the schedule (local time, as the scheduler).
    (upcoming,) = row.xpath(".//td[@class='next-check']/time")
    zone = get_localzone()
    now = dt.datetime.now(zone)
    slot = now.replace(hour=6, minute=0, second=0, microsecond=0)
    if slot <= now:
        slot = (now + dt.timedelta(days=1)).replace(hour=6, minute=0, second=0, microsecond=0)
    expected = slot.astimezone(dt.UTC).replace(tzinfo=None).isoformat() + "Z"
    assert upcoming.get("datetime") == expected
    # The page's own view says the same, and offers "Check now" too.
    page_id = int(row.xpath(".//form[contains(@class, 'check-now')]/@action")[0].split("/")[2])
    doc = assert_safe(user_client.get(f"/pages/{page_id}").get_data(as_text=True))
    shown = [t.get("datetime") for t in doc.xpath("//main/p/time")]
    assert shown == [last.get("datetime"), expected]
    assert doc.xpath(f"//form[@action='/pages/{page_id}/check']")
    # No default schedule (as a master starting with it off sets the due times): a page
    # without a schedule of its own is checked by whatever cycle runs.
    monkeypatch.setenv("JODL_SCHEDULE", "off")
    with sessionmaker(app.extensions["jodl"].engine).begin() as s:
        sync_jobs(s, [page_id])
    doc = lxml.html.fromstring(user_client.get("/pages").get_data(as_text=True))
    (cell,) = doc.xpath("//td[@class='next-check']")
    assert cell.text_content().strip() == "when a cycle runsdefault schedule"  # <br> between


def test_operator_views_show_readable_times(app: Flask, admin_client: FlaskClient) -> None:
    store = app.extensions["jodl"].store
    node = store.add_node("127.0.0.1:9", slots=2)
    store.update_node(node.id, last_seen=utcnow())
    admin_client.post("/admin/cycle", data={"csrf_token": token(admin_client)})
    doc = assert_safe(admin_client.get("/admin/").get_data(as_text=True))
    assert not ISO.search(text_of(doc))
    assert doc.xpath("//table[@id='nodes']//time[@datetime]")
    assert doc.xpath("//ul[@id='cycle-requests']//time[@datetime]")
    with sessionmaker(app.extensions["jodl"].engine)() as s:
        assert s.scalar(select(Page.id)) is None  # nothing else was made on the way


def test_check_now_through_the_api(app: Flask, user_client: FlaskClient) -> None:
    """What the page list's button does, the API does: the batch that waits for a fresh
    fetch, the baseline check queued, and the same refusals."""
    import base64

    from test_web_views import PASSWORD

    page_id = tracked_page(app, "user@example.org")
    basic = base64.b64encode(f"user@example.org:{PASSWORD}".encode()).decode()
    headers = {"Authorization": f"Basic {basic}"}
    r = user_client.post(f"/api/pages/{page_id}/check", headers=headers, json={})
    assert r.status_code == 202, r.get_data(as_text=True)
    answer = r.get_json()
    assert answer["answers"] == f"/api/batches/{answer['batch']}"
    mine = Reach.ALLOWLIST
    assert queued(app) == {KEY_PREFIXES[mine] + URL, baselines.KEY_PREFIX + URL}
    finish_all(app, "fresh")
    (result,) = user_client.get(answer["answers"]).get_json()["results"]
    assert result["title"] == "fresh" and not result["cached"]
    # Not a page of yours, a field it does not take, no CSRF header with a session.
    assert user_client.post("/api/pages/999/check", headers=headers, json={}).status_code == 404
    r = user_client.post(f"/api/pages/{page_id}/check", headers=headers, json={"url": URL})
    assert r.status_code == 400 and "url" in r.get_json()["message"]
    assert user_client.post(f"/api/pages/{page_id}/check", json={}).status_code == 403
