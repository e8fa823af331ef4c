"""One master acts per database: the lease is renewed by its holder and not stolen."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import sys
import time

import psycopg
import pytest
from agents import wait_for
from sqlalchemy import select, update

from jodl.exceptions import Fenced, LeaseHeld
from jodl.log.lease import check_fence
from jodl.log.models import MasterLease, utcnow
from jodl.log.store import Store
from jodl.master import Master
from jodl.master.leadership import EXPIRY_SLACK, Leadership


def _expires(store: Store) -> dt.datetime:
    with store.engine.connect() as conn:
        return conn.scalar(select(MasterLease.expires_at).where(MasterLease.name == "master"))


def test_a_second_master_does_not_steal_a_live_lease(store, settings):
    first = Master(settings, store=store, name="first")
    second = Master(settings, store=Store(store.engine), name="second")
    try:
        first.start()
        with pytest.raises(LeaseHeld, match=r"a master \(first\) is running"):
            second.start()
        assert store.lease_holder() == "first"
        first.step()  # the first master keeps working: it was not fenced
    finally:
        second.close()
        first.close()
    assert store.lease_holder() is None, "a clean stop releases the lease"


def test_the_running_master_renews_its_lease(store, settings):
    master = Master(settings, store=store, name="renewing")
    try:
        master.start()
        # Pretend the lease is about to run out and the last renewal is long ago.
        soon = utcnow() + dt.timedelta(seconds=1)
        with store.engine.begin() as conn:
            conn.execute(update(MasterLease).values(expires_at=soon))
        # The renewer thread extends it within a third of the TTL, steps or not.
        later = soon + dt.timedelta(seconds=settings.lease_ttl / 2)
        wait_for(lambda: _expires(store) > later, timeout=10 * settings.lease_ttl)
        master.step()
    finally:
        master.close()


def test_an_expired_lease_is_taken_and_its_old_holder_is_fenced(store, settings):
    old = Master(settings, store=store, name="stalled")
    new = Master(settings, store=Store(store.engine), name="new")
    try:
        old.start()
        with store.engine.begin() as conn:  # the old master stalled past its lease
            conn.execute(update(MasterLease).values(expires_at=utcnow()))
        new.start()
        assert store.lease_holder() == "new"
        wait_for(lambda: old.leadership.lost, timeout=10 * settings.lease_ttl)
        with pytest.raises(Fenced, match="took over"):
            old.step()
    finally:
        old.close()
        new.close()


def test_takeover_takes_a_live_lease(store, settings):
    old = Master(settings, store=store, name="old")
    new = Master(settings, store=Store(store.engine), name="new", takeover=True)
    try:
        old.start()
        new.start()
        assert new.epoch > old.epoch and store.lease_holder() == "new"
    finally:
        old.close()
        new.close()


def test_a_killed_master_on_this_host_does_not_hold_the_lease(store, settings):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    holder = f"{socket.gethostname()}:{gone.pid}"
    dead = Master(settings, store=store, name=holder)
    dead.start()  # never closed: as if SIGKILLed
    master = Master(settings, store=Store(store.engine), name="next")
    try:
        assert store.lease_holder() is None
        master.start()
        assert store.lease_holder() == "next"
    finally:
        master.close()
        dead.leadership.stop_renewing()  # a killed process renews nothing either


def test_a_cycle_asked_of_the_serving_master_is_run_by_it(store, settings, agents):
    import threading

    from jodl.admin.requests import RunRequests, follow

    store.add_jobs("noop", {f"k{i}": {} for i in range(6)}, create=True)
    agents(1)
    master = Master(settings, store=store, name="serving")
    master.feeders.append(RunRequests(store, poll=0.05))
    master.start()
    stop = threading.Event()
    thread = threading.Thread(target=master.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        asked = Store(store.engine)
        with pytest.raises(LeaseHeld):
            Master(settings, store=asked, name="second").start()
        seen: list[tuple[int, int]] = []
        row = follow(
            asked, asked.request_run("noop"), lambda: True, lambda d, t: seen.append((d, t))
        )
        assert row.error is None and row.summary.startswith("run noop#1: 6/6 done"), row.summary
        assert row.taken_by == "serving" and row.dead == 0
        missing = follow(asked, asked.request_run("nosuch"), lambda: True)
        assert "no family 'nosuch'" in missing.error
    finally:
        stop.set()
        thread.join(timeout=30)
        master.close()
    assert all(total == 6 for _, total in seen)


def test_a_standby_looks_again_as_the_refused_lease_expires(store):
    leader = Leadership(store, "leader", ttl=5.0)
    standby = Leadership(store, "standby", ttl=5.0)
    assert leader.gain(["f"]) == ["f"]
    assert standby.next_look() == standby.poll_every, "nothing refused yet: the poll"
    with store.engine.begin() as conn:  # the leader hung: its lease ends in 0.2 s
        soon = utcnow() + dt.timedelta(seconds=0.2)
        conn.execute(
            update(MasterLease).where(MasterLease.holder == "leader").values(expires_at=soon)
        )
    assert standby.gain(["f"]) == []
    wait = standby.next_look()
    assert 0 < wait <= 0.2 + EXPIRY_SLACK < standby.poll_every, "woken as it expires"
    time.sleep(wait)
    assert standby.gain(["f"]) == ["f"], "taken at the first look after the expiry"
    assert standby.next_look() == standby.poll_every


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
def test_a_takeover_ends_the_write_of_a_leader_stopped_mid_statement(store):
    # The leader's write transaction shares its lease row, then stops in the middle of
    # a COPY (its process frozen): not idle, so no idle timeout ends it.
    leader = Leadership(store, "leader", ttl=1.0)
    standby = Leadership(store, "standby", ttl=5.0)
    assert leader.gain(["f"]) == ["f"]
    conn = store.engine.connect()
    conn.begin()
    check_fence(conn, leader.epoch)
    conn.exec_driver_sql("CREATE TEMP TABLE stuck (x int)")
    copying = conn.connection.driver_connection.cursor().copy("COPY stuck FROM STDIN")
    copy = copying.__enter__()
    copy.write_row((1,))
    try:
        assert standby.gain(["f"]) == [], "a live lease: its write is left alone"
        time.sleep(1.0)  # the lease expires
        assert standby.gain(["f"]) == ["f"], "taken: the stopped write was ended"
        with pytest.raises(psycopg.OperationalError, match="terminat"):
            copying.__exit__(None, None, None)
    finally:
        conn.invalidate()
        conn.close()
    with store.engine.connect() as check:
        assert check.scalar(select(MasterLease.holder).where(MasterLease.name == "family:f")) == (
            "standby"
        )
