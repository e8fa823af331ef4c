"""Standby masters on PostgreSQL: real ``jodl master`` processes, real agents.

Ground truth is the ``mark`` family's file (one line per real run of a job) and the
log. Several masters start at once: one leads the family (the lease row
``family:mark``), the others stand by; when the leader is killed (SIGKILL) or stalls
past its TTL (SIGSTOP), a standby takes over and resumes the unfinished run without
running again a job whose result was committed, and the stalled leader, once woken,
writes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agents import run_jodl, spawn_jodl, wait_for
from sqlalchemy import func, select
from test_crash import add_mark_jobs, check_complete, check_marks, executions, runs_by_key

from jodl.log.models import Dispatch, ExecState, Execution, Job, MasterLease, MasterNode, Run
from jodl.log.store import Store
from jodl.master.leadership import rendezvous

postgres = pytest.mark.parametrize(
    "db_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)

#: The masters' lease TTL in these tests (seconds): short, so takeovers come fast.
TTL = 2.0


def start_masters(
    count: int, db_url: str, tmp_path: Path, ttl: float = TTL
) -> list[subprocess.Popen[bytes]]:
    env = {
        "JODL_DATABASE_URL": db_url,
        "JODL_LEASE_TTL": str(ttl),
        "JODL_METRICS_LISTEN": "",
        "JODL_CALL_TIMEOUT": "3",
    }
    return [
        spawn_jodl("master", log_path=tmp_path / f"master{i}.log", env=env) for i in range(count)
    ]


#: The lease the tests watch: the one family's.
SCOPE = "family:mark"


def lease(store: Store, scope: str = SCOPE) -> tuple[str, int] | None:
    """(holder, epoch) of a held lease on ``scope``; None when nobody holds it."""
    with store.engine.connect() as conn:
        row = conn.execute(
            select(MasterLease.holder, MasterLease.epoch).where(MasterLease.name == scope)
        ).first()
    return None if row is None or not row[0] else (row[0], row[1])


def settled(store: Store, count: int) -> tuple[str, int]:
    """Wait for ``count`` live masters and the family led by the one hashing picks
    among them (the first master up may lead it for a moment and hand it over)."""

    def check() -> tuple[str, int] | None:
        live = store.masters.live()
        now = lease(store)
        if len(live) == count and now is not None and now[0] == rendezvous(SCOPE, live):
            return now
        return None

    found = wait_for(check, timeout=30, what=f"{count} live masters, the family led")
    assert isinstance(found, tuple)
    return found


def by_pid(masters: list[subprocess.Popen[bytes]], holder: str) -> subprocess.Popen[bytes]:
    pid = int(holder.split(":")[1])
    (found,) = [m for m in masters if m.pid == pid]
    return found


def committed_keys(store: Store) -> set[str]:
    with store.engine.connect() as conn:
        return set(
            conn.scalars(
                select(Job.key)
                .join(Execution, Execution.job_id == Job.id)
                .where(Execution.state == ExecState.DONE)
            )
        )


def logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("master*.log")))


def exit_code(process: subprocess.Popen[bytes], tmp_path: Path, timeout: float) -> int:
    """``process``'s exit code, failing with the masters' logs when it is still running
    after ``timeout`` seconds."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"master {process.pid} still running after {timeout:g}s\n{logs(tmp_path)}"
        ) from None


def wait_logged(condition, tmp_path: Path, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """:func:`wait_for`, failing with the masters' logs (read when it fails)."""
    try:
        wait_for(condition, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs(tmp_path)}") from None


def run_finished(store: Store, request: int, tmp_path: Path, what: str) -> Any:
    """Wait for the run asked by ``request`` to finish (failing with the masters' logs);
    its request row, which says the run ended without an error or a dead job."""
    wait_logged(lambda: store.run_request(request).finished_at is not None, tmp_path, 90, what)
    row = store.run_request(request)
    assert row.error is None and row.dead == 0, row.summary
    return row


def stop_all(masters: list[subprocess.Popen[bytes]]) -> None:
    for m in masters:
        if m.poll() is None:
            os.kill(m.pid, signal.SIGCONT)
            m.kill()
            m.wait()


class LeaseWatch:
    """Samples the lease row and the masters' registry every 20 ms from a thread.

    ``leaders``: (time, holder, epoch) whenever the holder changed; ``epochs_by_holder``
    maps each holder to the epochs seen with it (a holder never shares an epoch).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.seen: list[tuple[float, str, int]] = []
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            now = lease(self.store)
            if now is not None and (not self.seen or self.seen[-1][1:] != now):
                if self.seen and now[1] <= self.seen[-1][2]:
                    self.errors.append(f"epoch did not grow: {self.seen[-1]} -> {now}")
                self.seen.append((time.monotonic(), *now))
            time.sleep(0.02)

    def close(self) -> list[tuple[float, str, int]]:
        self.stop.set()
        self.thread.join()
        assert not self.errors, self.errors
        return self.seen


def dispatch_epochs(store: Store) -> Counter[int]:
    with store.engine.connect() as conn:
        return Counter(conn.scalars(select(Dispatch.epoch)))


@postgres
def test_three_masters_started_at_once_one_leads(store, agents, db_url, tmp_path):
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=60, seconds=0.05)
    agents(2, slots=4)
    watch = LeaseWatch(store)
    masters = start_masters(3, db_url, tmp_path)
    try:
        settled(store, 3)
        request = store.request_run("mark")
        wait_for(
            lambda: store.run_request(request).finished_at is not None,
            timeout=60,
            what=f"the run to finish\n{logs(tmp_path)}",
        )
        rows = store.masters.masters()
        assert sorted(r.role for r in rows) == ["leader", "standby", "standby"], rows
        shown = run_jodl("status", "--json", env={"JODL_DATABASE_URL": db_url})
        assert shown.returncode == 0, shown.stderr
        roles = {m["name"]: m["role"] for m in json.loads(shown.stdout)["masters"]}
        assert sorted(roles.values()) == ["leader", "standby", "standby"], roles
        assert all(m.poll() is None for m in masters), "standbys wait; they do not exit"
    finally:
        seen = watch.close()
        stop_all(masters)
    # One holder at every sample (the watch checks epochs only grow); the first one
    # up may have led the family until the others registered and hashing moved it.
    assert len(seen) <= 3, f"a handover per master registering at most: {seen}"
    holder, epoch = seen[-1][1:]
    leader_row = [r for r in rows if r.role == "leader"]
    assert leader_row[0].name == holder
    assert rendezvous(SCOPE, sorted(r.name for r in rows)) == holder, "hashing picked it"
    assert set(dispatch_epochs(store)) == {epoch}, "every dispatch carries the leader's epoch"
    after = executions(store)
    check_complete(store, after)
    check_marks(store, marks, after)
    assert set(runs_by_key(marks).values()) == {1}, "no job ran twice"


def two_masters_and_a_cycle(store, agents, db_url, tmp_path):  # type: ignore[no-untyped-def]
    """160 mark jobs of 0.1 s, two agents of 3 slots, two masters, the lease watched:
    (the marks file, the masters, the watch)."""
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=160, seconds=0.1)
    agents(2, slots=3)
    return marks, start_masters(2, db_url, tmp_path), LeaseWatch(store)


def take_over_mid_cycle(store, agents, db_url, tmp_path, stall: bool, after: int = 30) -> None:  # type: ignore[no-untyped-def]
    """The leader is killed (or stopped) once ``after`` jobs have a committed result
    (0: once its first batch is logged as sent, before any result)."""
    marks, masters, watch = two_masters_and_a_cycle(store, agents, db_url, tmp_path)
    try:
        holder, old_epoch = settled(store, 2)
        leader = by_pid(masters, holder)
        request = store.request_run("mark")
        wait_for(
            lambda: len(committed_keys(store)) >= after and sum(dispatch_epochs(store).values()),
            timeout=60,
            what=f"the cycle to be under way\n{logs(tmp_path)}",
        )
        leader.send_signal(signal.SIGSTOP if stall else signal.SIGKILL)
        done_at_kill = committed_keys(store)
        wait_logged(
            lambda: (lease(store) or ("", 0))[0] != holder,
            tmp_path,
            timeout=10 * TTL,
            what="a standby to take over",
        )
        new_holder, new_epoch = lease(store) or ("", 0)
        assert new_epoch > old_epoch
        with store.engine.connect() as conn:
            old_rows_at_takeover = conn.scalar(
                select(func.count()).where(Execution.epoch == old_epoch)
            ) + conn.scalar(select(func.count()).where(Dispatch.epoch == old_epoch))
        if stall:
            leader.send_signal(signal.SIGCONT)
            # Woken past its TTL, the old leader finds itself fenced and stands by.
            wait_logged(
                lambda: "stops, standing by" in logs(tmp_path),
                tmp_path,
                30,
                "the old leader to stand by",
            )
            assert leader.poll() is None, logs(tmp_path)
        row = run_finished(store, request, tmp_path, "the new leader to finish the run")
        assert row.taken_by == new_holder
    finally:
        seen = watch.close()
        stop_all(masters)
    # The takeover; the old leader, standing by again, may lead the idle family later.
    holders = [s[1] for s in seen]
    assert [holder, new_holder] in [holders[i : i + 2] for i in range(len(holders))], seen
    with store.engine.connect() as conn:
        old_rows_after = conn.scalar(
            select(func.count()).where(Execution.epoch == old_epoch)
        ) + conn.scalar(select(func.count()).where(Dispatch.epoch == old_epoch))
    assert old_rows_after == old_rows_at_takeover, "the old leader wrote after the takeover"
    after = executions(store)
    check_complete(store, after)
    check_marks(store, marks, after)
    ran = runs_by_key(marks)
    again = {key for key, n in ran.items() if n > 1 and key in done_at_kill}
    assert not again, f"jobs with a committed result ran again: {sorted(again)}"
    assert len(ran) == 160, "no job lost"


@postgres
@pytest.mark.parametrize("after", [0, 30, 100])
def test_leader_killed_mid_cycle_a_standby_finishes_the_run(store, agents, db_url, tmp_path, after):
    take_over_mid_cycle(store, agents, db_url, tmp_path, stall=False, after=after)


@postgres
def test_leader_stalled_past_its_ttl_is_fenced(store, agents, db_url, tmp_path):
    take_over_mid_cycle(store, agents, db_url, tmp_path, stall=True)


@postgres
def test_a_request_whose_run_ended_under_a_dead_master_gets_that_runs_outcome(
    store, agents, db_url, tmp_path
):
    """The leader dies after committing the run's end and before settling the request:
    the next leader settles it with that run (never running it again)."""
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=12, seconds=0.01)
    agents(1, slots=3)
    env = {"JODL_DATABASE_URL": db_url, "JODL_LEASE_TTL": str(TTL), "JODL_METRICS_LISTEN": ""}
    first = spawn_jodl(
        "master", log_path=tmp_path / "master0.log", env={**env, "JODL_FAILPOINT": "run_ended"}
    )
    masters = [first]
    try:
        settled(store, 1)
        request = store.request_run("mark")
        assert exit_code(first, tmp_path, 60) == -signal.SIGKILL, logs(tmp_path)
        assert store.run_request(request).finished_at is None
        masters.append(spawn_jodl("master", log_path=tmp_path / "master1.log", env=env))
        row = run_finished(store, request, tmp_path, "the next leader to settle the request")
    finally:
        stop_all(masters)
    (run_id,) = runs_of(store)
    assert row.run_id == run_id and "12/12 done" in row.summary, row.summary
    assert set(runs_by_key(marks).values()) == {1}, "no job ran twice"


def runs_of(store: Store) -> list[int]:
    with store.engine.connect() as conn:
        return list(conn.scalars(select(Run.id)))


@postgres
def test_sigterm_hands_over_at_once(store, db_url, tmp_path):
    store.ensure_family("mark")
    masters = start_masters(2, db_url, tmp_path)
    try:
        holder, _ = settled(store, 2)
        leader = by_pid(masters, holder)
        leader.send_signal(signal.SIGTERM)
        assert exit_code(leader, tmp_path, 30) == 0, logs(tmp_path)
        with store.engine.connect() as conn:
            left = conn.scalar(select(func.count()).where(MasterNode.name == holder))
        assert left == 0, "a clean stop leaves the live masters"
        # Released, not expired: the standby takes it within a poll (TTL/10), long
        # before the TTL; checked against the TTL itself with a wide margin.
        started = time.monotonic()
        wait_for(lambda: (lease(store) or (holder, 0))[0] != holder, timeout=10 * TTL)
        assert time.monotonic() - started < TTL, "handed over without waiting for the TTL"
    finally:
        stop_all(masters)


@postgres
def test_sigterm_mid_cycle_ends_the_step_and_a_standby_finishes(store, agents, db_url, tmp_path):
    """SIGTERM in the middle of a cycle: the leader ends its step, commits what came in,
    releases its lease and exits 0; the standby takes over at once (well under the TTL)
    and finishes the run; no job runs twice (the marks say so, and the log agrees)."""
    marks, masters, watch = two_masters_and_a_cycle(store, agents, db_url, tmp_path)
    try:
        holder, old_epoch = settled(store, 2)
        leader = by_pid(masters, holder)
        request = store.request_run("mark")
        wait_logged(
            lambda: len(committed_keys(store)) >= 30, tmp_path, 60, "the cycle to be under way"
        )
        leader.send_signal(signal.SIGTERM)
        assert exit_code(leader, tmp_path, 10 * TTL) == 0, logs(tmp_path)
        exited = time.monotonic()
        done_at_exit = committed_keys(store)
        wait_logged(
            lambda: (lease(store) or (holder, 0))[0] != holder, tmp_path, 10 * TTL, "a takeover"
        )
        assert time.monotonic() - exited < TTL, "handed over without waiting for the TTL"
        run_finished(store, request, tmp_path, "the new leader to finish the run")
    finally:
        seen = watch.close()
        stop_all(masters)
    assert seen[-1][1] != holder and seen[-1][2] > old_epoch, seen
    after = executions(store)
    check_complete(store, after)
    check_marks(store, marks, after)
    ran = runs_by_key(marks)
    again = {key for key, n in ran.items() if n > 1 and key in done_at_exit}
    assert not again, f"jobs with a committed result ran again: {sorted(again)}"
    assert len(ran) == 160, "no job lost"
    assert set(ran.values()) == {1}, f"a job ran twice: {[k for k, n in ran.items() if n > 1]}"


def test_sigterm_stops_a_one_shot_run_between_steps(store, agents, db_url, tmp_path):
    """``jodl run`` on SIGTERM ends its step, commits and says so in one line; the run
    stays open and the next ``jodl run`` resumes it: every job runs once in all."""
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=80, seconds=0.1)
    agents(1, slots=2)
    env = {"JODL_DATABASE_URL": db_url, "JODL_METRICS_LISTEN": ""}
    first = spawn_jodl("run", "mark", log_path=tmp_path / "master0.log", env=env)
    try:
        wait_logged(lambda: len(committed_keys(store)) >= 10, tmp_path, 60, "the cycle to start")
        first.send_signal(signal.SIGTERM)
        assert exit_code(first, tmp_path, 30) == 1, logs(tmp_path)
    finally:
        stop_all([first])
    assert "stopped: run mark#1 left unfinished" in logs(tmp_path)
    done_at_stop = committed_keys(store)
    assert len(done_at_stop) < 80
    again = run_jodl("run", "mark", env=env)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "mark#1 (resumed): 80/80 done" in again.stdout, again.stdout
    after = executions(store)
    check_complete(store, after)
    check_marks(store, marks, after)
    assert set(runs_by_key(marks).values()) == {1}, "a job ran twice"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_second_master_on_sqlite_refuses_with_one_line(store, db_url, tmp_path):
    env = {"JODL_DATABASE_URL": db_url, "JODL_METRICS_LISTEN": ""}
    first = spawn_jodl("master", log_path=tmp_path / "master0.log", env=env)
    try:
        wait_logged(lambda: lease(store, "master") is not None, tmp_path, 30, "the first master")
        second = run_jodl("master", env=env, timeout=60)
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert "SQLite database has one master" in lines[0], lines[0]
        assert first.poll() is None, "the first master goes on"
    finally:
        stop_all([first])
