"""PostgreSQL restarted in the middle of a cycle: the cycle completes, nothing runs twice.

Real ``jodl master`` processes and real agents run ``mark`` jobs (one line per real
run in a marks file); the database server is restarted while the cycle is under way
(``pg_ctl restart -m fast``, which ends every connection). The masters lose their
connections, their lease renewals fail for a few seconds, and the leader may stop
dispatching (at 2/3 of its TTL); once the server answers again it leads on, or a
standby takes over, and the run finishes: every job has exactly one committed result
and one mark line, and the log agrees with the marks.

The server restarted is a throwaway cluster of this file's own (``tests/pg_cluster.py``:
initdb into a temporary folder, a free port), never the machine's server named by
``JODL_TEST_DATABASE_URL``, whose other clients would lose their connections. The
tests need PostgreSQL's server binaries (``initdb``, ``pg_ctl``); where they are
missing the tests fail with the reason, since a skipped test would hide a promise that
was never checked (they are skipped, as every PostgreSQL test is, when
``JODL_TEST_DATABASE_URL`` is unset).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import pytest
from agents import spawn_jodl, wait_for
from pg_cluster import ThrowawayCluster, cluster_for_tests
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.exc import OperationalError
from test_crash import add_mark_jobs, check_complete, check_marks, executions, runs_by_key
from test_standby import committed_keys, lease, logs, start_masters, stop_all

from jodl.log import normalise_url
from jodl.log.models import RunRequest
from jodl.log.store import Store

pytestmark = [pytest.mark.pg_restart, pytest.mark.postgres]

#: Jobs of the cycle and each one's sleep: about six seconds of work on six slots, so
#: the restart (two or three seconds here) falls well inside the cycle.
JOBS = 240
SECONDS = 0.15
#: Committed results before the restart: the cycle is under way.
UNDER_WAY = 30
#: Seconds the server has to answer again after the restart command returned.
BACK_WITHIN = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    """This file's own PostgreSQL server, the one its tests restart."""
    yield from cluster_for_tests()


@pytest.fixture
def db_url(cluster: ThrowawayCluster) -> Iterator[str]:
    """A fresh database on the throwaway cluster (instead of conftest's two databases)."""
    name = f"jodl_t_{secrets.token_hex(6)}"
    admin = create_engine(cluster.url(), isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield cluster.url(name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def restart_postgres(cluster: ThrowawayCluster, store: Store) -> float:
    """Restart the server (fast: connections are ended) and wait until it answers;
    the seconds it took."""
    started = time.monotonic()
    cluster.restart()
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


def requests_filed(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(RunRequest)) or 0


def finished(store: Store, request: int, masters: list) -> bool:  # type: ignore[type-arg]
    """The run request is settled; AssertionError at once when every master exited."""
    if all(m.poll() is not None for m in masters):
        raise AssertionError("every master exited")
    return store.run_request(request).finished_at is not None


def cycle_across_a_restart(store, agents, db_url, cluster, tmp_path, masters_count, ttl) -> float:  # type: ignore[no-untyped-def]
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
        # `jodl run` beside the serving masters asks for the same cycle and follows it.
        env = {"JODL_DATABASE_URL": db_url, "JODL_METRICS_LISTEN": ""}
        masters.append(spawn_jodl("run", "mark", log_path=tmp_path / "follower.log", env=env))
        wait_for(
            lambda: requests_filed(store) == 2 or masters[-1].poll() is not None,
            timeout=60,
            what="the follower to ask for the cycle",
        )
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
        follower = masters.pop()
        assert follower.wait(timeout=60) == 0, (tmp_path / "follower.log").read_text()
        assert "mark#1" in (tmp_path / "follower.log").read_text()
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


def test_one_master_survives_a_restart_mid_cycle(store, agents, db_url, cluster, tmp_path):
    # The default TTL: the outage may outlast 2/3 of it, or not; either way the run ends.
    cycle_across_a_restart(store, agents, db_url, cluster, tmp_path, masters_count=1, ttl=5.0)


def test_with_a_standby_the_cycle_completes_across_a_restart(
    store, agents, db_url, cluster, tmp_path
):
    # A TTL shorter than the outage: the leader stops dispatching, and whichever master
    # takes the lease once the server answers finishes the run.
    cycle_across_a_restart(store, agents, db_url, cluster, tmp_path, masters_count=2, ttl=2.0)


def test_a_one_shot_run_completes_across_a_restart(store, agents, db_url, cluster, tmp_path):
    """``jodl run mark`` (the master of one cycle) rides out the restart too."""
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


def test_the_restart_leaves_the_machines_server_alone(cluster):
    """The server restarted is the throwaway one: a connection to the server named by
    ``JODL_TEST_DATABASE_URL`` opened before the restart still answers after it."""
    ours = create_engine(cluster.url())
    machines = create_engine(normalise_url(os.environ["JODL_TEST_DATABASE_URL"]))
    try:
        with machines.connect() as kept, ours.connect() as ended:
            before = kept.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            cluster.restart()
            with pytest.raises(OperationalError):
                ended.exec_driver_sql("SELECT 1")
            assert kept.exec_driver_sql("SELECT pg_backend_pid()").scalar() == before
    finally:
        ours.dispose()
        machines.dispose()
