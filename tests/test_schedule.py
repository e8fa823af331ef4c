"""Scheduled application cycles: cron, one at a time, a missed run once, checks spread."""

from __future__ import annotations

import datetime as dt
import json
import signal
import threading
import time

import pytest
from agents import spawn_jodl, wait_for
from app_support import add_users_tracking, agent_env, app_settings, inbox
from sqlalchemy import select
from sqlalchemy import update as sql_update
from sqlalchemy.orm import sessionmaker

from crawler_app.checking.confirm import BASELINE_FETCHES
from crawler_app.checking.cycle import PageCycle, spread_fraction
from crawler_app.checking.cycle_requests import request_cycle
from crawler_app.checking.due import Schedule, local_zone
from crawler_app.checking.schedule import CycleScheduler, MasterRunner
from crawler_app.models import AppCycle, CycleRequest, CycleStep, Page
from crawler_app.settings import AppSettings, cron_trigger
from jodl.exceptions import ConfigError
from jodl.log.models import Job, utcnow
from jodl.master import Master

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest

UTC = dt.UTC
#: Requests of a page's first check: its baseline is learned from more than one fetch.
FIRST_CHECK_FETCHES = 1 + BASELINE_FETCHES


def cycles(store) -> list[AppCycle]:
    with sessionmaker(store.engine, expire_on_commit=False)() as s:
        return list(s.scalars(select(AppCycle).order_by(AppCycle.id)))


def add_cycle(store, started: dt.datetime, open_: bool = False) -> None:
    with sessionmaker(store.engine)() as s, s.begin():
        row = AppCycle(
            step=CycleStep.CHECK if open_ else CycleStep.DONE,
            started_at=started,
            step_started_at=started,
            finished_at=None if open_ else started + dt.timedelta(seconds=5),
            timings={},
        )
        s.add(row)
        s.flush()
        if not open_:
            row.is_open = None  # closed, as a finished cycle is


def test_cron_expressions_with_and_without_seconds():
    daily = cron_trigger("0 6 * * *", UTC)
    now = dt.datetime(2030, 5, 1, 7, 0, tzinfo=UTC)
    assert daily.get_next_fire_time(None, now) == dt.datetime(2030, 5, 2, 6, 0, tzinfo=UTC)
    every_2s = cron_trigger("*/2 * * * * *", UTC)
    assert every_2s.get_next_fire_time(None, now + dt.timedelta(seconds=1)) == now.replace(second=2)
    with pytest.raises(ValueError):
        cron_trigger("61 * * * *", UTC)
    assert app_settings().schedule == "0 6 * * *"
    assert AppSettings.from_env({"JODL_SCHEDULE": "*/2 * * * * *"}).schedule == "*/2 * * * * *"
    assert AppSettings.from_env({"JODL_SCHEDULE": " Off "}).schedule == "off"
    with pytest.raises(ConfigError, match="JODL_SCHEDULE: not a cron expression"):
        AppSettings.from_env({"JODL_SCHEDULE": "every day"})


def test_a_slot_with_nothing_tracked_does_nothing(store):
    asked = []
    sched = CycleScheduler(store.engine, asked.append, app_settings())
    assert sched.run_cycle() is None
    assert asked == [] and cycles(store) == []


def test_a_missed_run_is_due_once_and_an_open_cycle_at_once(store):
    sched = CycleScheduler(store.engine, lambda family: None, app_settings(), timezone=UTC)
    assert sched.missed()  # never ran: the first run is now
    add_cycle(store, utcnow() - dt.timedelta(minutes=1))
    assert not sched.missed()  # ran after the last 06:00 slot or the slot is yet to come...
    now = dt.datetime.now(UTC)
    last_slot = now.replace(hour=6, minute=0, second=0, microsecond=0)
    if last_slot > now:
        last_slot -= dt.timedelta(days=1)
    add_cycle(store, (last_slot - dt.timedelta(days=3)).replace(tzinfo=None))
    assert not sched.missed()  # ... the newest cycle counts, not the oldest
    with sessionmaker(store.engine)() as s, s.begin():
        for row in s.scalars(select(AppCycle)):
            row.started_at = (last_slot - dt.timedelta(days=3)).replace(tzinfo=None)
    assert sched.missed()  # three slots passed: due, and once (see the serving test)
    add_cycle(store, utcnow(), open_=True)
    assert sched.missed()  # an unfinished cycle resumes at start


def test_spread_is_capped_at_a_quarter_of_the_period(store):
    hourly = CycleScheduler(
        store.engine, lambda f: None, app_settings(schedule="0 * * * *", check_spread=3600)
    )
    assert hourly.spread() == 900
    daily = CycleScheduler(store.engine, lambda f: None, app_settings(check_spread=300))
    assert daily.spread() == 300
    off = CycleScheduler(store.engine, lambda f: None, app_settings(check_spread=0))
    assert off.spread() == 0


def test_checks_start_spread_by_url_hash(store, agents, settings, site, inbox):
    spread = 1.5
    # Six pages whose slots lie across the window: a URL's slot comes from its hash, the
    # test site's port included, so six fixed paths fell within 0.3 of it about once in
    # a hundred runs. They are taken evenly, by slot, from sixty.
    pool = sorted((spread_fraction(site.url(f"/s{i}")), f"/s{i}") for i in range(60))
    paths = [pool[i * (len(pool) - 1) // 5][1] for i in range(6)]
    for path in paths:
        site.set_page(path, f"<p>{path}</p>")
        add_users_tracking(store, site.url(path), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    master = Master(settings, store=store)
    wall_minus_mono = time.time() - time.monotonic()
    try:
        result = PageCycle(store.engine, master.run_cycle, app_settings()).run(
            trigger="schedule", spread=spread
        )
    finally:
        master.close()
    assert result.checked == len(paths)
    with sessionmaker(store.engine)() as s:
        started = s.scalar(select(AppCycle.started_at))
        payloads = {
            url: json.loads(payload)
            for url, payload in s.execute(select(Page.url, Job.payload).join(Job))
        }
    start = started.replace(tzinfo=UTC).timestamp()
    for path in paths:
        url = site.url(path)
        expected = start + spread_fraction(url) * spread
        assert payloads[url]["start_at"] == pytest.approx(expected, abs=0.002)
        fetched_at = site.requests(path)[0].started + wall_minus_mono
        assert fetched_at >= expected - 0.05, path  # never before its slot
    fractions = sorted(spread_fraction(site.url(p)) for p in paths)
    assert fractions[-1] - fractions[0] > 0.3  # the slots really are spread


def test_serving_master_runs_one_cycle_at_a_time_and_catches_up_once(
    store, agents, settings, site, inbox
):
    site.set_page("/slow", "<p>slow page</p>", delay=0.6)
    add_users_tracking(store, site.url("/slow"), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    # The last cycle ran three hourly slots ago: one catch-up run at start, not three.
    add_cycle(store, utcnow() - dt.timedelta(hours=3, minutes=1))
    master = Master(settings, store=store)
    stop = threading.Event()
    serving = threading.Thread(target=master.serve, args=(stop,), daemon=True)
    serving.start()
    hourly = CycleScheduler(
        store.engine,
        MasterRunner(master),
        app_settings(schedule="0 * * * *"),
    )
    try:
        hourly.start()
        wait_for(lambda: len(hourly.results) == 1, 30, "the catch-up cycle")
        nxt = hourly.next_run_time()
        assert nxt is not None and nxt > dt.datetime.now(nxt.tzinfo)
        assert nxt.minute == 0 and nxt.second == 0
        assert len(cycles(store)) == 2
    finally:
        hourly.stop(wait=True)
    # Every second, while a cycle takes longer than that: never two at once.
    fast = CycleScheduler(
        store.engine,
        MasterRunner(master),
        app_settings(schedule="* * * * * *"),
    )
    try:
        fast.start()
        wait_for(lambda: len(fast.results) >= 3, 60, "three scheduled cycles")
    finally:
        fast.stop(wait=True)
        stop.set()
        serving.join(timeout=30)
        master.close()
    done = [c for c in cycles(store) if c.finished_at is not None]
    for earlier, later in zip(done, done[1:], strict=False):
        assert later.started_at >= earlier.finished_at
    assert all(c.trigger == "schedule" for c in done[1:])


def test_jodl_master_runs_the_scheduled_cycle(store, agents, site, inbox, db_url, tmp_path):
    site.set_page("/p", "<p>hello</p>")
    add_users_tracking(store, site.url("/p"), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    master = spawn_jodl(
        "master",
        log_path=tmp_path / "master.log",
        env={
            "JODL_DATABASE_URL": db_url,
            "JODL_SCHEDULE": "0 6 * * *",
            "JODL_CHECK_SPREAD": "0",
            "JODL_LOG_LEVEL": "INFO",
        },
    )
    try:
        # No cycle ever ran: the first one runs at start.
        wait_for(
            lambda: any(c.step == CycleStep.DONE for c in cycles(store)),
            60,
            "a cycle run by jodl master",
        )
    finally:
        master.send_signal(signal.SIGTERM)
        master.wait(timeout=20)
    (cycle,) = cycles(store)
    assert (cycle.trigger, cycle.checked) == ("schedule", 1)
    assert len(site.requests("/p")) == FIRST_CHECK_FETCHES
    assert "scheduled (0 6 * * *)" in (tmp_path / "master.log").read_text()


def requests_of(store) -> list[CycleRequest]:
    with sessionmaker(store.engine, expire_on_commit=False)() as s:
        return list(s.scalars(select(CycleRequest).order_by(CycleRequest.id)))


def test_requests_are_served_with_the_schedule_off(store):
    sched = CycleScheduler(
        store.engine, lambda family: None, app_settings(schedule="off"), request_poll=0.05
    )
    assert sched.trigger is None and not sched.missed()
    sched.start()
    try:
        assert sched.next_run_time() is None  # no scheduled cycle
        request_cycle(store.engine, None)
        wait_for(lambda: all(r.taken_at for r in requests_of(store)), 30, "the request taken")
    finally:
        sched.stop(wait=True)
    (req,) = requests_of(store)
    assert req.taken_by == "master" and req.cycle_id is None  # nothing tracked: no cycle
    assert cycles(store) == []


def test_jodl_master_runs_requested_cycles_one_at_a_time(
    store, agents, site, inbox, db_url, tmp_path
):
    site.set_page("/slow", "<p>slow</p>", delay=2.0)
    add_users_tracking(store, site.url("/slow"), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    add_cycle(store, utcnow())  # ran just now: nothing to catch up at start
    master = spawn_jodl(
        "master",
        log_path=tmp_path / "master.log",
        env={
            "JODL_DATABASE_URL": db_url,
            "JODL_SCHEDULE": "0 6 1 1 *",
            "JODL_CHECK_SPREAD": "0",
            # No tick during the test: only the operators' requests start cycles.
            "JODL_CHECK_TICK": "86400",
            "JODL_LOG_LEVEL": "INFO",
        },
    )
    try:
        first = request_cycle(store.engine, None)
        (running,) = wait_for(
            lambda: [c for c in cycles(store) if c.trigger == "web" and c.finished_at is None],
            60,
            "the requested cycle running",
        )
        # Two more requests while it runs: they wait for it, then one cycle serves both.
        second = request_cycle(store.engine, None)
        third = request_cycle(store.engine, None)
        assert {c.id: c.finished_at for c in cycles(store)}[running.id] is None
        wait_for(lambda: all(r.cycle_id for r in requests_of(store)), 60, "every request served")
    finally:
        master.send_signal(signal.SIGTERM)
        master.wait(timeout=20)
    served = {r.id: r.cycle_id for r in requests_of(store)}
    assert served[first] == running.id
    assert served[second] == served[third] != running.id
    web = [c for c in cycles(store) if c.trigger == "web"]
    assert [c.id for c in web] == [running.id, served[second]]
    assert all(c.step == CycleStep.DONE for c in web)
    # A requested cycle checks the pages due: the page, never checked, in the first; not
    # again in the second (its yearly default schedule's next time is far away).
    assert [c.checked for c in web] == [1, 0]
    assert web[1].started_at >= web[0].finished_at  # never two at once
    assert len(site.requests("/slow")) == FIRST_CHECK_FETCHES
    assert all(r.taken_by for r in requests_of(store))
    # The polls that found a cycle running returned at once, without APScheduler's warning.
    log = (tmp_path / "master.log").read_text()
    assert "cycle requested by an operator" in log
    assert "maximum number of running instances reached" not in log


def test_a_requested_cycle_is_not_spread(store, agents, settings, site, inbox):
    # A daily schedule spreading its checks over five minutes: an operator's request
    # beside it must still check every page at once, not over those five minutes.
    paths = ["/now1", "/now2", "/now3"]
    for path in paths:
        site.set_page(path, f"<p>{path}</p>")
        add_users_tracking(store, site.url(path), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    add_cycle(store, utcnow())  # ran just now: nothing to catch up at start
    master = Master(settings, store=store)
    stop = threading.Event()
    serving = threading.Thread(target=master.serve, args=(stop,), daemon=True)
    serving.start()
    runner = MasterRunner(master)
    sched = CycleScheduler(
        store.engine,
        runner,
        # No tick during the test: it would start a spread cycle of these due pages.
        app_settings(schedule="0 6 * * *", check_spread=300, check_tick=86400),
        request_poll=0.1,
    )
    assert sched.spread() == 300  # a scheduled slot would be spread
    try:
        sched.start()
        request_cycle(store.engine, None)
        # Generous: a spread cycle would take up to 300 s, an unspread one seconds.
        wait_for(lambda: len(sched.results) == 1, 60, "the requested cycle to finish")
    finally:
        runner.stopped.set()
        sched.stop(wait=True)
        stop.set()
        serving.join(timeout=30)
        master.close()
    (result,) = sched.results
    assert result.checked == 3
    web = [c for c in cycles(store) if c.trigger == "web"]
    assert len(web) == 1 and web[0].spread == 0
    with sessionmaker(store.engine)() as s:
        payloads = [json.loads(p) for p in s.scalars(select(Job.payload).join(Page))]
    assert len(payloads) == 3 and not any("start_at" in p for p in payloads)
    assert all(len(site.requests(p)) == FIRST_CHECK_FETCHES for p in paths)


def test_next_check_of_each_tracked_page(store):
    from crawler_app.checking.schedule import next_checks
    from crawler_app.users.pages import set_schedule, sync_jobs

    add_users_tracking(store, "http://pages.example/daily", ["ann@example.org"])
    add_users_tracking(store, "http://pages.example/hourly", ["ann@example.org"])
    with sessionmaker(store.engine)() as s, s.begin():
        ids = dict(s.execute(select(Page.url, Page.id)).tuples().all())
        set_schedule(s, "ann@example.org", "http://pages.example/hourly", Schedule(every=3600))
    daily, hourly = ids["http://pages.example/daily"], ids["http://pages.example/hourly"]
    # Never checked: due now, both.
    now = dt.datetime.now(UTC) + dt.timedelta(seconds=5)
    got = next_checks(store.engine, [daily, hourly], now, UTC)
    assert got == {daily: now, hourly: now}
    # Checked by a cycle a tick started at 07:00: the hourly page at 08:00, the daily one
    # at the default schedule's next 06:00 (local time, as the scheduler reads it).
    checked = dt.datetime(2030, 5, 1, 7, 0)
    with sessionmaker(store.engine)() as s, s.begin():
        s.execute(sql_update(Page).values(slot_at=checked))
        sync_jobs(s, settings=app_settings())
    got = next_checks(store.engine, [daily, hourly], dt.datetime(2030, 5, 1, 7, 30, tzinfo=UTC))
    assert got[hourly] == dt.datetime(2030, 5, 1, 8, 0, tzinfo=UTC)
    six = cron_trigger("0 6 * * *", local_zone()).get_next_fire_time(
        None, checked.replace(tzinfo=UTC)
    )
    assert got[daily] == six
    # A due time passed: the next tick checks it.
    later = dt.datetime(2030, 5, 3, tzinfo=UTC)
    assert next_checks(store.engine, [hourly], later, UTC) == {hourly: later}
    # No default schedule: a page without one of its own has no time (any cycle checks it).
    with sessionmaker(store.engine)() as s, s.begin():
        sync_jobs(s, settings=app_settings(schedule="off"))
    assert daily not in next_checks(store.engine, [daily, hourly], later, UTC)


def test_a_new_database_is_not_catching_up(store, caplog):
    caplog.set_level("INFO", logger="crawler_app.schedule")
    sched = CycleScheduler(store.engine, lambda family: None, app_settings(), timezone=UTC)
    sched.start()
    try:
        started = [r.getMessage() for r in caplog.records if "scheduled" in r.getMessage()]
    finally:
        sched.stop()
    assert len(started) == 1 and "(the first run)" in started[0], started
    add_cycle(store, utcnow() - dt.timedelta(days=3))  # an old database that missed slots
    caplog.clear()
    sched = CycleScheduler(store.engine, lambda family: None, app_settings(), timezone=UTC)
    sched.start()
    sched.stop()
    assert any("catching up a missed run" in r.getMessage() for r in caplog.records)
