"""PostgreSQL restarted in the middle of a cycle: the cycle completes, nothing runs twice.

Real ``jodl master`` processes and real agents run ``mark`` jobs (one line per real
run in a marks file); the database server is restarted while the cycle is under way
(``pg_ctlcluster ... main restart``, which ends every connection). The masters lose
their connections, their lease renewals fail for a few seconds, and the leader may
stop dispatching (at 2/3 of its TTL); once the server answers again it leads on, or
a standby takes over, and the run finishes: every job has exactly one committed
result and one mark line, and the log agrees with the marks.

The restart ends the connections of *every* client of this server: tests of this
file are marked ``pg_restart`` and kept in a file of their own, and the restart is
the brief one of the cluster's own tool. Run serially (as CI does), they disturb
nobody. Where the server cannot be restarted from here (not root, another host, no
``pg_ctlcluster``) they fail with the reason: a skipped test would hide a promise
that was never checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from agents import spawn_jodl, wait_for
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from test_crash import add_mark_jobs, check_complete, check_marks, executions, runs_by_key
from test_standby import committed_keys, lease, logs, start_masters, stop_all

from jodl.log.store import Store

pytestmark = [
    pytest.mark.pg_restart,
    pytest.mark.parametrize(
        "db_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
    ),
]

#: Jobs of the cycle and each one's sleep: about six seconds of work on six slots, so
#: the restart (two or three seconds here) falls well inside the cycle.
JOBS = 240
SECONDS = 0.15
#: Committed results before the restart: the cycle is under way.
UNDER_WAY = 30
#: Seconds the server has to answer again after the restart command returned.
BACK_WITHIN = 60.0


def cluster_of(db_url: str) -> tuple[str, str]:
    """The (version, name) of the local cluster serving ``db_url``; fails with the reason
    when it cannot be restarted from this process."""
    host = make_url(db_url).host or "localhost"
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("/"):
        pytest.fail(f"PostgreSQL at {host} is not on this machine: it cannot be restarted here")
    if shutil.which("pg_ctlcluster") is None:
        pytest.fail("pg_ctlcluster is not installed: PostgreSQL cannot be restarted here")
    if os.geteuid() != 0:
        pytest.fail("restarting PostgreSQL (pg_ctlcluster) needs root; run the tests as root")
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if len(versions) != 1:
        pytest.fail(f"expected one PostgreSQL version in /etc/postgresql, found {versions}")
    return versions[0], "main"


def restart_postgres(cluster: tuple[str, str], store: Store) -> float:
    """Restart the server (fast: connections are ended) and wait until it answers;
    the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "restart"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        pytest.fail(f"pg_ctlcluster restart failed: {done.stderr.strip() or done.stdout.strip()}")
    wait_for(lambda: answers(store), timeout=BACK_WITHIN, what="PostgreSQL to answer again")
    return time.monotonic() - started


def answers(store: Store) -> bool:
    try:
        with store.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return True
    except OperationalError:
        return False


def quietly(condition):  # type: ignore[no-untyped-def]
    """``condition`` for :func:`wait_for` that counts a database not answering as False."""

    def check() -> object:
        try:
            return condition()
        except OperationalError:
            return False

    return check


def finished(store: Store, request: int, masters: list) -> bool:  # type: ignore[type-arg]
    """The run request is settled; AssertionError at once when every master exited."""
    if all(m.poll() is not None for m in masters):
        raise AssertionError("every master exited")
    return store.run_request(request).finished_at is not None


def cycle_across_a_restart(store, agents, db_url, tmp_path, masters_count, ttl) -> float:  # type: ignore[no-untyped-def]
    cluster = cluster_of(db_url)
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=JOBS, seconds=SECONDS)
    agents(2, slots=3)
    masters = start_masters(masters_count, db_url, tmp_path, ttl)
    try:
        wait_for(lambda: lease(store) is not None, timeout=30, what="a leader")
        wait_for(
            lambda: len(store.masters.live()) == masters_count, timeout=30, what="every master"
        )
        request = store.request_run("mark")
        wait_for(
            lambda: len(committed_keys(store)) >= UNDER_WAY,
            timeout=60,
            what=f"the cycle to be under way\n{logs(tmp_path)}",
        )
        took = restart_postgres(cluster, store)
        done_before = committed_keys(store)
        assert len(done_before) < JOBS, "the cycle ended before the restart: nothing was tested"
        try:
            wait_for(
                quietly(lambda: finished(store, request, masters)),
                timeout=120,
                what="the run to finish after the restart",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs(tmp_path)}") from None
        row = store.run_request(request)
        assert row.error is None and row.dead == 0, row.summary
        # A master leads on or stands by; one exits only when it finds that another
        # took over meanwhile (as any fenced master does).
        exited = [i for i, m in enumerate(masters) if m.poll() is not None]
        for i in exited:
            text = (tmp_path / f"master{i}.log").read_text()
            assert "another master took over" in text, f"master{i} exited:\n{text}"
        assert len(exited) < len(masters), f"every master exited\n{logs(tmp_path)}"
    finally:
        stop_all(masters)
    after = executions(store)
    check_complete(store, after)
    check_marks(store, marks, after)
    ran = runs_by_key(marks)
    assert len(ran) == JOBS, "no job lost"
    again = {key for key, n in ran.items() if n > 1}
    assert not again, f"jobs ran twice: {sorted(again)}\n{logs(tmp_path)}"
    return took


def test_one_master_survives_a_restart_mid_cycle(store, agents, db_url, tmp_path):
    # The default TTL: the outage may outlast 2/3 of it, or not; either way the run ends.
    cycle_across_a_restart(store, agents, db_url, tmp_path, masters_count=1, ttl=5.0)


def test_with_a_standby_the_cycle_completes_across_a_restart(store, agents, db_url, tmp_path):
    # A TTL shorter than the outage: the leader stops dispatching, and whichever master
    # takes the lease once the server answers finishes the run.
    cycle_across_a_restart(store, agents, db_url, tmp_path, masters_count=2, ttl=2.0)


def test_a_one_shot_run_completes_across_a_restart(store, agents, db_url, tmp_path):
    """``jodl run mark`` (the master of one cycle) rides out the restart too."""
    cluster = cluster_of(db_url)
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=JOBS, seconds=SECONDS)
    agents(2, slots=3)
    env = {"JODL_DATABASE_URL": db_url, "JODL_METRICS_LISTEN": "", "JODL_CALL_TIMEOUT": "3"}
    master = spawn_jodl("run", "mark", log_path=tmp_path / "master0.log", env=env)
    try:
        wait_for(
            lambda: len(committed_keys(store)) >= UNDER_WAY or master.poll() is not None,
            timeout=60,
            what="the cycle to be under way",
        )
        restart_postgres(cluster, store)
        assert len(committed_keys(store)) < JOBS, "the cycle ended before the restart"
        assert master.wait(timeout=120) == 0, logs(tmp_path)
    finally:
        stop_all([master])
    assert "mark#1" in logs(tmp_path)
    after = executions(store)
    check_complete(store, after)
    check_marks(store, marks, after)
    ran = runs_by_key(marks)
    assert len(ran) == JOBS, "no job lost"
    assert set(ran.values()) == {1}, f"jobs ran twice: {[k for k, n in ran.items() if n > 1]}"
