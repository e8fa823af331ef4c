"""Baselines (crawler_app.checking.baselines) end to end: real agents, a real SMTP inbox,
the database.

A new tracking takes its baseline at once, through the on-demand queue of a
serving master, so an edit made before the first cycle is mailed in that cycle;
a view kept from before models were learned compares with its stored baseline;
what a view learned to vary stays out of the diff mailed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from agents import run_jodl, wait_for
from app_support import add_users_tracking, agent_env, app_settings, inbox, run_app_cycle
from sqlalchemy import null, select, update
from sqlalchemy.orm import sessionmaker

from crawler_app.checking import baselines
from crawler_app.checking.schedule import CycleScheduler, MasterRunner
from crawler_app.models import Page, PageView, Snapshot
from jodl.master import Master
from jodl.queue import Queue, QueueFeeder

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest


def html(*lines: str) -> str:
    return (
        "<html><head><title>Shop</title></head><body>"
        + "".join(f"<p>{line}</p>" for line in lines)
        + "</body></html>"
    )


def views(store) -> list[tuple[str, str | None]]:
    with sessionmaker(store.engine)() as s:
        return list(s.execute(select(PageView.selector, PageView.fingerprint)).tuples())


@contextmanager
def serving_with_scheduler(store, settings) -> Iterator[CycleScheduler]:
    """A serving master (on-demand queue) with the page checker's scheduler beside it."""
    master = Master(settings, store=store)
    master.feeders.append(QueueFeeder(Queue(store)))
    stop = threading.Event()
    thread = threading.Thread(target=master.serve, args=(stop,), daemon=True)
    thread.start()
    runner = MasterRunner(master)
    scheduler = CycleScheduler(store.engine, runner, app_settings(schedule="off"), request_poll=0.2)
    scheduler.start()
    try:
        yield scheduler
    finally:
        runner.stopped.set()
        scheduler.stop()
        stop.set()
        thread.join(timeout=30)
        master.close()


def test_a_new_tracking_takes_its_baseline_at_once_and_its_first_cycle_mails_an_edit(
    store, agents, settings, site: TestSite, inbox
):
    site.set_page("/shop", html("Tea 4 EUR", "Coffee 6 EUR"))
    url = site.url("/shop")
    agents(1, env=agent_env(inbox))
    with serving_with_scheduler(store, settings) as scheduler:
        add_users_tracking(store, url, ["ann@example.org"])
        with sessionmaker(store.engine)() as s:
            page_id = s.scalar(select(Page.id))
        assert baselines.request(Queue(store), store.engine, [page_id]) == 1
        # The first fetch after tracking (twice, to learn what varies) is the baseline.
        wait_for(lambda: all(fp for _, fp in views(store)), 30, "the baseline")
        assert len(site.requests("/shop")) == 2
        assert baselines.request(Queue(store), store.engine, [page_id]) == 0
        site.set_page("/shop", html("Tea 5 EUR", "Coffee 6 EUR"))
        result = scheduler.run_cycle("command")
    assert result is not None and (result.changed, result.sent) == (1, 1)
    (mail,) = inbox.to("ann@example.org")
    assert "- Tea 4 EUR" in mail.text and "+ Tea 5 EUR" in mail.text
    with sessionmaker(store.engine)() as s:
        kinds = [k for (k,) in s.execute(select(Snapshot.kind).order_by(Snapshot.id))]
    assert kinds == ["baseline", "change"]


def test_a_view_kept_from_before_models_compares_with_its_stored_baseline(
    store, agents, settings, site: TestSite, inbox
):
    site.set_page("/shop", html("Tea 4 EUR", "Coffee 6 EUR"))
    add_users_tracking(store, site.url("/shop"), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    app = app_settings()
    assert run_app_cycle(store, settings, app).changed == 0
    # As the migration leaves it: a baseline (fingerprint and snapshot), no model.
    with sessionmaker(store.engine)() as s, s.begin():
        s.execute(update(PageView).values(model=null()))
    site.set_page("/shop", html("Tea 5 EUR", "Coffee 6 EUR"))
    second = run_app_cycle(store, settings, app)
    assert (second.changed, second.sent) == (1, 1)
    (mail,) = inbox.to("ann@example.org")
    assert "- Tea 4 EUR" in mail.text and "+ Tea 5 EUR" in mail.text


def test_what_a_view_learned_to_vary_stays_out_of_the_diff_mailed(
    store, agents, settings, site: TestSite, inbox
):
    ads = ["Ad: shoes", "Ad: hats", "Ad: boots", "Ad: socks", "Ad: belts"]
    price = ["Tea 4 EUR"]

    def page(n: int, _headers: dict[str, str]) -> dict[str, str]:
        # A clock and a rotating ad on every request; the price only when edited.
        return {"body": html(price[0], f"Served at 12:00:{n % 60:02d}", ads[n % len(ads)])}

    site.set_maker("/shop", page)
    add_users_tracking(store, site.url("/shop"), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    app = app_settings()
    assert run_app_cycle(store, settings, app).changed == 0
    price[0] = "Tea 5 EUR"
    second = run_app_cycle(store, settings, app)
    assert (second.changed, second.sent) == (1, 1)
    (mail,) = inbox.to("ann@example.org")
    assert "- Tea 4 EUR" in mail.text and "+ Tea 5 EUR" in mail.text
    assert "Served at" not in mail.text and "Ad:" not in mail.text


def test_a_new_pages_baseline_fetches_follow_one_another(store, agents, db_url, site: TestSite):
    # Confirming a difference waits JODL_CONFIRM_DELAY (an hour here); a new page's two
    # baseline fetches do not: a cycle of new pages ends without waiting at all.
    urls = []
    for n in range(3):
        site.set_page(f"/new{n}", html(f"Page {n}", "text"))
        urls.append(site.url(f"/new{n}"))
    agents(1, env={**agent_env(), "JODL_CONFIRM_DELAY": "3600"})
    for url in urls:
        add_users_tracking(store, url, ["ann@example.org"])
    # An hour's wait would outlast the command's time (it is killed, and this fails).
    cycle = run_jodl("cycle", env={"JODL_DATABASE_URL": db_url}, timeout=120)
    assert cycle.returncode == 0, cycle.stderr
    assert [len(site.requests(f"/new{n}")) for n in range(3)] == [2, 2, 2]
    assert all(fp for _, fp in views(store))
