"""Pausing and resuming trackings: pages, the app cycle on real agents, CLI, API, web page."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_web_views
from agents import run_jodl
from app_support import add_users_tracking, agent_env, app_settings, run_app_cycle
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker
from test_web_api import USER, make_app
from test_web_views import assert_safe, token

from crawler_app.checking import baselines
from crawler_app.models import Page, Snapshot, Tracking
from crawler_app.users import pages
from crawler_app.users.pages import normalise_url
from jodl.log.models import Job, JobState
from jodl.queue import Queue

pytest_plugins = ("tests.site",)

app = test_web_views.app
user_client = test_web_views.user_client

HTML = "<html><head><title>Stock</title></head><body><p>three left</p></body></html>"


def job_state(store, url: str) -> str | None:
    with sessionmaker(store.engine)() as s:
        page = s.scalar(select(Page).where(Page.url == normalise_url(url)))
        assert page is not None
        return s.scalar(select(Job.state).where(Job.id == page.job_id)) if page.job_id else None


def pause(store, email: str, url: str, paused: bool) -> int:
    with sessionmaker(store.engine).begin() as s:
        return pages.set_paused(s, email, url, paused)


def test_a_page_all_its_trackers_paused_is_not_fetched_and_keeps_its_history(
    store, agents, settings, site
):
    site.set_page("/p", HTML)
    url = site.url("/p")
    agents(1, env=agent_env())
    add_users_tracking(store, url, ["ann@example.org", "bob@example.org"])
    app_cfg = app_settings()

    run_app_cycle(store, settings, app_cfg)
    first = len(site.requests("/p"))
    assert first >= 1
    with sessionmaker(store.engine)() as s:
        kept = s.scalar(select(func.count()).select_from(Snapshot))
    assert kept >= 1  # the baseline

    # One of two trackers pauses: the page is still fetched once per cycle for the other.
    assert pause(store, "ann@example.org", url, True) == 1
    run_app_cycle(store, settings, app_cfg)
    second = len(site.requests("/p"))
    assert second > first

    # Both paused: no fetch, the job retired, the history kept.
    assert pause(store, "bob@example.org", url, True) == 1
    assert pause(store, "bob@example.org", url, True) == 0  # already paused
    assert job_state(store, url) == JobState.DELETED
    run_app_cycle(store, settings, app_cfg)
    assert len(site.requests("/p")) == second
    with sessionmaker(store.engine)() as s:
        assert s.scalar(select(func.count()).select_from(Snapshot)) == kept
        assert s.scalar(select(func.count()).select_from(Tracking)) == 2

    # Resumed: back in the cycles.
    assert pause(store, "ann@example.org", url, False) == 1
    assert job_state(store, url) == JobState.IDLE
    run_app_cycle(store, settings, app_cfg)
    assert len(site.requests("/p")) > second


def test_pausing_a_page_one_does_not_track_is_refused(store):
    with sessionmaker(store.engine).begin() as s:
        pages.add_user(s, "ann@example.org")
        pages.add_user(s, "bob@example.org")
        pages.track(s, "ann@example.org", "http://news.example/")
    with pytest.raises(pages.PageError, match="bob@example.org does not track"):
        pause(store, "bob@example.org", "http://news.example/", True)
    with pytest.raises(pages.PageError, match="does not track"):
        pause(store, "ann@example.org", "http://other.example/", True)
    queue = Queue(store.engine)
    pause(store, "ann@example.org", "http://news.example/", True)
    assert baselines.request(queue, store.engine, page_ids(store)) == 0  # all paused
    pause(store, "ann@example.org", "http://news.example/", False)
    assert baselines.request(queue, store.engine, page_ids(store)) == 1


def page_ids(store) -> list[int]:
    with sessionmaker(store.engine)() as s:
        return list(s.scalars(select(Page.id)))


def test_cli_pause_and_resume(store, db_url):
    env = {"JODL_DATABASE_URL": db_url}
    assert run_jodl("users", "add", "carol@example.org", env=env).returncode == 0
    url = "http://example.org/x"
    assert run_jodl("track", url, "--user", "carol@example.org", env=env).returncode == 0
    paused = run_jodl("pause", url, "--user", "carol@example.org", env=env)
    assert paused.returncode == 0, paused.stderr
    assert "1 tracking(s) of http://example.org/x paused" in paused.stdout
    assert job_state(store, url) == JobState.DELETED
    listing = run_jodl("tracked", env=env)
    assert "(paused)" in listing.stdout
    resumed = run_jodl("resume", url, "--user", "carol@example.org", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert job_state(store, url) == JobState.IDLE
    refused = run_jodl("pause", "http://example.org/y", "--user", "carol@example.org", env=env)
    assert refused.returncode == 1
    assert refused.stderr.strip() == "error: carol@example.org does not track http://example.org/y"


def test_api_pause_resume_and_refused_fields(tmp_path: Path) -> None:
    application = make_app(tmp_path)
    client = application.test_client()
    try:
        r = client.post(
            "/api/pages", json={"url": "http://a.example/", "paused": True}, headers=USER
        )
        assert r.status_code == 201 and r.get_json()["paused"] is True
        queue = application.extensions["jodl"].queue
        assert queue.jobs("check_page", state="queued") == []  # no baseline fetch while paused
        page_id = r.get_json()["id"]
        (listed,) = client.get("/api/pages", headers=USER).get_json()["pages"]
        assert listed["paused"] is True and listed["next_check_at"] is None
        r = client.patch(f"/api/pages/{page_id}", json={"paused": False}, headers=USER)
        assert r.status_code == 200 and r.get_json()["paused"] is False
        assert len(queue.jobs("check_page", state="queued")) == 1  # its baseline, on resume
        (listed,) = client.get("/api/pages", headers=USER).get_json()["pages"]
        assert listed["paused"] is False
        for body, field in (
            ({"paused": "yes"}, "paused"),
            ({}, "paused"),
            ({"paused": True, "selector": "p"}, "selector"),
        ):
            r = client.patch(f"/api/pages/{page_id}", json=body, headers=USER)
            assert r.status_code == 400 and r.get_json()["message"].startswith(f"{field}:")
        # Never silently ignored: fields the server does not honour are refused.
        for body, field in (
            ({"url": "http://b.example/", "paused": 1}, "paused"),
            ({"url": "http://b.example/", "interval": 900}, "interval"),
        ):
            r = client.post("/api/pages", json=body, headers=USER)
            assert r.status_code == 400 and r.get_json()["message"].startswith(f"{field}:")
        assert (
            client.patch("/api/pages/999", json={"paused": True}, headers=USER).status_code == 404
        )
        spec = client.get("/api/openapi.json").get_json()
        assert "patch" in spec["paths"]["/api/pages/{page_id}"]
    finally:
        application.extensions["jodl"].engine.dispose()


def test_pause_and_resume_buttons_on_the_tracked_pages(
    app: Flask, user_client: FlaskClient
) -> None:
    with sessionmaker(app.extensions["jodl"].engine).begin() as s:
        tracking = pages.track(s, "user@example.org", "http://news.example/")
        page_id, tracking_id = tracking.page_id, tracking.id
    doc = assert_safe(user_client.get("/pages").get_data(as_text=True))
    (form,) = doc.xpath("//form[contains(@class, 'pause')]")
    assert form.get("action") == f"/pages/{page_id}/pause?tracking={tracking_id}"
    assert form.xpath("string(.//button)") == "Pause"
    # Without the CSRF token the form is refused.
    assert user_client.post(form.get("action"), data={"paused": "on"}).status_code == 403
    csrf = token(user_client, "/pages")
    r = user_client.post(form.get("action"), data={"paused": "on", "csrf_token": csrf})
    assert r.status_code == 303
    doc = assert_safe(user_client.get("/pages").get_data(as_text=True))
    assert doc.xpath("string(//td[@class='next-check'])").strip() == "paused"
    (form,) = doc.xpath("//form[contains(@class, 'pause')]")
    assert form.xpath("string(.//button)") == "Resume"
    r = user_client.post(form.get("action"), data={"paused": "off", "csrf_token": csrf})
    assert r.status_code == 303
    with sessionmaker(app.extensions["jodl"].engine)() as s:
        assert s.get(Tracking, tracking_id).paused is False  # type: ignore[union-attr]
