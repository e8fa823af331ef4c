"""Schedules per tracking (crawler_app.checking.due): bounds, due times with a controlled clock,
one fetch per due time on real agents, pause and resume, the tick, the CLI and the API."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import test_web_views
from agents import run_jodl
from app_support import agent_env, app_settings, run_app_cycle
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import sessionmaker
from test_web_api import USER, make_app
from test_web_views import assert_safe, token

from crawler_app.checking.due import (
    Clock,
    Schedule,
    ScheduleError,
    check_schedule_of,
    floor_to_tick,
)
from crawler_app.checking.schedule import CycleScheduler, due_spread
from crawler_app.models import AppCycle, Page, Snapshot, Tracking
from crawler_app.users import pages
from jodl.log import Reads, utcnow
from jodl.master import Master

pytest_plugins = ("tests.site",)
app = test_web_views.app
user_client = test_web_views.user_client

HTML = "<html><head><title>Stock</title></head><body><p>three left</p></body></html>"
BOUNDS = app_settings()  # 5 minutes to 4 weeks


def test_durations_and_bounds_refused_in_one_line():
    assert check_schedule_of("15m", None, BOUNDS) == Schedule(every=900)
    assert check_schedule_of("2h", None, BOUNDS).every == 7200
    assert check_schedule_of("1d", None, BOUNDS).every == 86400
    assert check_schedule_of("1w", None, BOUNDS).describe() == "every 1 week"
    assert check_schedule_of(None, "*/30 * * * *", BOUNDS).describe() == "cron */30 * * * *"
    assert check_schedule_of(None, None, BOUNDS) == Schedule()
    refused = {
        ("90s", None): "interval 90 s (90 s) is outside the operator's bounds: 5 min to 4 weeks",
        ("5w", None): "interval 5 weeks",
        ("fortnight", None): "interval 'fortnight': a duration such as 15m",
        ("-5m", None): "interval '-5m'",
        (None, "* * * * *"): "cron '* * * * *' fires every 1 min",
        (None, "0,1 6 * * *"): "cron '0,1 6 * * *' fires every 1 min",
        (None, "61 * * * *"): "cron '61 * * * *':",
        (None, "*/5 * * *"): "cron '*/5 * * *': five fields",
        ("1h", "0 6 * * *"): "give an interval or a cron expression, not both",
    }
    for (every, cron), start in refused.items():
        with pytest.raises(ScheduleError) as caught:
            check_schedule_of(every, cron, BOUNDS)
        message = str(caught.value)
        assert message.startswith(start), message
        assert "\n" not in message
    # The operator's bounds are settings.
    tight = app_settings(check_every_min=3600)
    with pytest.raises(ScheduleError, match="outside the operator's bounds: 1 h to 4 weeks"):
        check_schedule_of("15m", None, tight)


def test_a_page_is_due_at_the_earliest_of_its_active_trackings_once_per_due_time():
    clock = Clock(app_settings(schedule="0 6 * * *"), dt.UTC)
    both = [Schedule(every=900), Schedule(every=3600)]
    start = dt.datetime(2030, 5, 1, 10, 0)
    # Never checked: due at once.
    assert clock.page_due(both, None, start) == start
    # A controlled clock walking two hours, checking the page whenever it is due: the
    # cycle that checks it counts from its tick, and the next due time from there.
    fetches: list[dt.datetime] = []
    anchor = None
    now = start
    while now <= start + dt.timedelta(hours=2):
        due = clock.page_due(both, anchor, now)
        if due is not None and due <= now:
            fetches.append(now)
            anchor = floor_to_tick(now, 60)
        now += dt.timedelta(minutes=1)
    assert fetches == [start + dt.timedelta(minutes=15 * i) for i in range(9)]
    # The hourly tracking alone (the other paused): every hour.
    assert clock.page_due([Schedule(every=3600)], start, start) == start + dt.timedelta(hours=1)
    # The default schedule: checked at 06:00, due the next day's 06:00, not again at once.
    six = dt.datetime(2030, 5, 2, 6, 0)
    assert clock.page_due([Schedule()], six - dt.timedelta(days=1), six) == six
    assert clock.page_due([Schedule()], floor_to_tick(six, 60), six) == six + dt.timedelta(days=1)
    # With the default schedule off, a tracking without one asks for no time of its own.
    off = Clock(app_settings(schedule="off"), dt.UTC)
    assert off.page_due([Schedule()], start, start) is None
    assert off.page_due([Schedule(), Schedule(every=900)], start, start) == start + dt.timedelta(
        minutes=15
    )


def elapse(store, minutes: int) -> None:
    """Let ``minutes`` pass for the page: its last cycle's start moves that far back (a
    controlled clock for the due times; the cycles themselves run now)."""
    with sessionmaker(store.engine).begin() as s:
        for page in s.scalars(select(Page)):
            if page.slot_at is not None:
                page.slot_at -= dt.timedelta(minutes=minutes)
        pages.sync_jobs(s, settings=app_settings())


def test_two_trackings_of_one_page_fetch_it_once_per_due_time(store, agents, settings, site):
    site.set_page("/p", HTML)
    url = site.url("/p")
    agents(1, env=agent_env())
    with sessionmaker(store.engine).begin() as s:
        for email, every in (("ann@example.org", "15m"), ("bob@example.org", "1h")):
            pages.add_user(s, email)
            pages.track(s, email, url, schedule=check_schedule_of(every, None, BOUNDS))

    def cycle() -> int:
        """Run a cycle of the due pages; how many requests the page got in it."""
        before = len(site.requests("/p"))
        run_app_cycle(store, settings, trigger="schedule")
        return len(site.requests("/p")) - before

    assert cycle() >= 1  # never checked: due at once (its baseline)
    assert cycle() == 0  # checked a moment ago: due in 15 minutes
    elapse(store, 10)
    assert cycle() == 0
    # Every 15 minutes for an hour: one fetch per due time, also at the hour, when both
    # trackings are due.
    for _ in range(4):
        elapse(store, 5)
        assert cycle() == 1
        elapse(store, 10)
    with sessionmaker(store.engine)() as s:
        kept = s.scalar(select(func.count()).select_from(Snapshot))
        assert s.scalar(select(Page.last_checked_at)) is not None

    # Ann pauses: her 15 minutes do not count, Bob's hour does.
    with sessionmaker(store.engine).begin() as s:
        assert pages.set_paused(s, "ann@example.org", url, True) == 1
    elapse(store, 5)  # 15 minutes after the last check
    assert cycle() == 0
    elapse(store, 45)  # an hour after it
    assert cycle() == 1
    # Resumed: her tracking and the page's history are as they were, and her schedule
    # counts again.
    with sessionmaker(store.engine).begin() as s:
        assert pages.set_paused(s, "ann@example.org", url, False) == 1
        ann = s.scalar(select(Tracking).where(Tracking.every == 900))
        assert ann is not None and not ann.paused
        assert s.scalar(select(func.count()).select_from(Snapshot)) == kept
    elapse(store, 15)
    assert cycle() == 1


def test_the_tick_starts_a_cycle_only_when_a_page_is_due(store, agents, settings, site):
    site.set_page("/t", HTML)
    url = site.url("/t")
    agents(1, env=agent_env())
    master = Master(settings, store=store)
    try:
        sched = CycleScheduler(store.engine, master.run_cycle, app_settings())
        assert sched.tick() is None  # nothing tracked
        with sessionmaker(store.engine).begin() as s:
            pages.add_user(s, "ann@example.org")
            pages.track(s, "ann@example.org", url, schedule=Schedule(every=3600))
        first = sched.tick()
        assert first is not None and first.checked == 1  # never checked: due
        assert Reads(store.engine).next_due("check_page") > utcnow()
        assert sched.tick() is None  # checked: nothing due for an hour, no cycle at all
        with sessionmaker(store.engine)() as s:
            assert s.scalar(select(func.count()).select_from(AppCycle)) == 1
        with sessionmaker(store.engine).begin() as s:
            s.execute(update(Page).values(slot_at=utcnow() - dt.timedelta(hours=1, minutes=1)))
            pages.sync_jobs(s, settings=app_settings())
        assert sched.due()
        again = sched.tick()
        assert again is not None and again.checked == 1
    finally:
        master.close()


def test_cli_every_and_cron(store, db_url):
    env = {"JODL_DATABASE_URL": db_url}
    assert run_jodl("users", "add", "carol@example.org", env=env).returncode == 0
    url = "http://example.org/x"
    done = run_jodl("track", url, "--user", "carol@example.org", "--every", "15m", env=env)
    assert done.returncode == 0, done.stderr
    assert "every 15 min; 1 tracker(s), one fetch per due time" in done.stdout
    assert "every 15 min" in run_jodl("tracked", env=env).stdout
    # Tracking it again through the same view changes its schedule.
    cron = run_jodl("track", url, "--user", "carol@example.org", "--cron", "*/30 * * * *", env=env)
    assert cron.returncode == 0, cron.stderr
    assert "cron */30 * * * *" in run_jodl("tracked", env=env).stdout
    for args, start in (
        (("--every", "1m"), "error: interval 1 min (60 s) is outside the operator's bounds"),
        (("--every", "soon"), "error: interval 'soon': a duration such as 15m"),
        (("--cron", "* * * * *"), "error: cron '* * * * *' fires every 1 min"),
        (("--cron", "99 * * * *"), "error: cron '99 * * * *':"),
    ):
        bad = run_jodl("track", url, "--user", "carol@example.org", *args, env=env)
        assert bad.returncode == 1
        assert bad.stderr.strip().startswith(start), bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    # Operators' bounds come from the settings.
    tight = run_jodl("track", url, "--user", "carol@example.org", "--every", "1h",
                     env={**env, "JODL_CHECK_EVERY_MIN": "7200"})  # fmt: skip
    assert tight.returncode == 1 and "2 h to 4 weeks" in tight.stderr
    back = run_jodl("track", url, "--user", "carol@example.org", "--default-schedule", env=env)
    assert back.returncode == 0 and "default schedule" in back.stdout
    with sessionmaker(store.engine)() as s:
        assert s.execute(select(Tracking.every, Tracking.cron)).all() == [(None, None)]


def test_api_every_and_cron(tmp_path: Path) -> None:
    application = make_app(tmp_path)
    client = application.test_client()
    try:
        r = client.post(
            "/api/pages", json={"url": "http://shop.example/", "every": 900}, headers=USER
        )
        assert r.status_code == 201, r.get_json()
        added = r.get_json()
        assert (added["every"], added["cron"], added["schedule"]) == (900, None, "every 15 min")
        (listed,) = client.get("/api/pages", headers=USER).get_json()["pages"]
        assert listed["schedule"] == "every 15 min" and listed["next_check_at"] is not None
        page_id = added["id"]
        r = client.patch(f"/api/pages/{page_id}", json={"cron": "0 7 * * 1"}, headers=USER)
        assert r.status_code == 200 and r.get_json()["schedule"] == "cron 0 7 * * 1"
        for body, start in (
            ({"every": 60}, "every: interval 1 min (60 s) is outside the operator's bounds"),
            ({"every": "15m"}, "every: whole seconds"),
            ({"every": True}, "every: whole seconds"),
            ({"cron": "* * * * *"}, "cron: cron '* * * * *' fires every 1 min"),
            ({"cron": "not a cron"}, "cron: cron 'not a cron': five fields"),
            ({"cron": 5}, "cron: five cron fields as text"),
            ({"interval": 900}, "interval: cannot be changed here"),
            ({"every": 900, "cron": "0 7 * * *"}, "every: give an interval or a cron"),
        ):
            r = client.patch(f"/api/pages/{page_id}", json=body, headers=USER)
            message = r.get_json()["message"]
            assert r.status_code == 400 and message.startswith(start), message
        (listed,) = client.get("/api/pages", headers=USER).get_json()["pages"]
        assert listed["cron"] == "0 7 * * 1"  # refused bodies change nothing
        r = client.patch(f"/api/pages/{page_id}", json={"every": None, "cron": None}, headers=USER)
        assert r.status_code == 200 and r.get_json()["schedule"] == "default schedule"
        for body, start in (
            ({"url": "http://b.example/", "every": 10}, "every: interval"),
            ({"url": "http://b.example/", "interval": 900}, "interval: not a field"),
        ):
            r = client.post("/api/pages", json=body, headers=USER)
            assert r.status_code == 400 and r.get_json()["message"].startswith(start)
        spec = client.get("/api/openapi.json").get_json()
        create = spec["paths"]["/api/pages"]["post"]["requestBody"]["content"]
        assert "every" in create["application/json"]["schema"]["properties"]
    finally:
        application.extensions["jodl"].engine.dispose()


def test_due_pages_start_spread_over_a_quarter_of_their_shortest_interval(store):
    with sessionmaker(store.engine).begin() as s:
        pages.add_user(s, "ann@example.org")
        pages.track(s, "ann@example.org", "http://daily.example/")
    spread = app_settings(check_spread=300)
    # A restart with only daily pages overdue: the whole JODL_CHECK_SPREAD.
    assert due_spread(store.engine, spread, 300) == 300
    with sessionmaker(store.engine).begin() as s:
        pages.track(s, "ann@example.org", "http://often.example/", schedule=Schedule(every=600))
    # A 10-minute page among the due ones: its checks start within 150 s.
    assert due_spread(store.engine, spread, 300) == 150
    # Once it is checked (not due), the daily pages spread over the whole window again.
    with sessionmaker(store.engine).begin() as s:
        s.execute(update(Page).where(Page.url == "http://often.example/").values(slot_at=utcnow()))
        pages.sync_jobs(s, settings=spread)
    assert due_spread(store.engine, spread, 300) == 300
    assert due_spread(store.engine, spread, 0) == 0


def test_the_tracking_form_takes_a_schedule_and_the_list_shows_it(
    app: Flask, user_client: FlaskClient
) -> None:
    csrf = token(user_client, "/pages")
    form = {"url": "http://shop.example/", "every": "15m", "csrf_token": csrf}
    assert user_client.post("/pages", data={**form, "csrf_token": "forged"}).status_code == 403
    r = user_client.post("/pages", data=form)
    assert r.status_code == 303, r.get_data(as_text=True)
    doc = assert_safe(user_client.get("/pages").get_data(as_text=True))
    (cell,) = doc.xpath("//td[@class='next-check']")
    assert cell.xpath("string(.//span[@class='schedule'])") == "every 15 min"
    assert cell.xpath(".//time/@datetime")  # "Next check" from the page's due time
    bad = {"url": "http://b.example/", "cron": "<b>* * * * *</b>", "csrf_token": csrf}
    r = user_client.post("/pages", data=bad)
    assert r.status_code == 400
    doc = assert_safe(r.get_data(as_text=True))  # the value is shown escaped
    assert "cron: cron '<b>* * * * *</b>'" in doc.text_content()
    assert doc.xpath("//input[@name='cron']/@value") == ["<b>* * * * *</b>"]
