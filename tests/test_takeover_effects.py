"""Effects once across takeovers, judged by the marks jobs leave in a file.

The path of a node given up on writes twice: its executions closed as lost (through
the log writer), then the dispatches that place its jobs again. A master killed
between any two of those writes, or after the send that follows them (failpoints
``lost_queued``, ``giveups_committed``, ``replacements_logged``,
``replacements_sent``), must leave a log from which the next master, one-shot or
serving, finishes the run without starting again a job whose result was committed,
and without letting the thawed agent run its queued copies.

A leader stopped past its lease and thawed after its standby finished the run
writes nothing more (the run's row, the nodes' rows and the old epoch's rows are
as the standby left them), rejoins as a standby, and never shows as a second leader.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agents import spawn_jodl, wait_for
from sqlalchemy import func, select
from test_crash import add_mark_jobs, check_complete, check_marks, executions
from test_standby import (
    SCOPE,
    committed_keys,
    exit_code,
    lease,
    logs,
    run_finished,
    settled,
    start_masters,
    stop_all,
    wait_logged,
)

from jodl.log.models import Dispatch, Execution, Node, Run
from jodl.log.store import Store
from jodl.master.leadership import rendezvous
from jodl.ops.status import masters as status_masters

postgres = pytest.mark.parametrize(
    "db_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)

#: Agents' job slots: also how many of a frozen agent's jobs may be mid-start or
#: mid-run when it froze (each ran once there and may run once more elsewhere).
SLOTS = 3
JOBS = 150
SECONDS = 0.05
#: The masters' call timeout (seconds): a frozen agent is given up on soon after.
CALL_TIMEOUT = "2"

KILL_POINTS = ["lost_queued", "giveups_committed", "replacements_logged", "replacements_sent"]


def marks_of(path: Path) -> list[tuple[str, str]]:
    """(agent port, job key) of every mark line, in the order written."""
    if not path.exists():
        return []
    return [
        (node.rpartition(":")[2], key)
        for node, key, *_ in (line.split(" ") for line in path.read_text().splitlines())
    ]


def master_env(db_url: str, **more: str) -> dict[str, str]:
    return {
        "JODL_DATABASE_URL": db_url,
        "JODL_LEASE_TTL": "2",
        "JODL_METRICS_LISTEN": "",
        "JODL_CALL_TIMEOUT": CALL_TIMEOUT,
        # Lost rows take 1.5 s to commit (as under load): the kill lands before.
        "JODL_FAILPOINT_SLOW": "commit_lost:1.5",
        **more,
    }


def freeze_when_busy(path: Path, agent: Any) -> None:
    """SIGSTOP ``agent`` once it has run some jobs (it holds a queue of them)."""
    wait_for(
        lambda: sum(1 for port, _ in marks_of(path) if port == str(agent.port)) >= 10,
        60,
        "the agent to be frozen to run some jobs",
    )
    os.kill(agent.pid, signal.SIGSTOP)


def judge(store: Store, path: Path, frozen_port: int, committed: set[str], at: int) -> None:
    """No job whose result was committed when the master died started again, but for
    the frozen agent's jobs caught between leaving its queue and their first line."""
    after = executions(store)
    check_complete(store, after)
    check_marks(store, path, after)
    marks = marks_of(path)
    again = [(port, key) for port, key in marks[at:] if key in committed]
    assert len(again) <= SLOTS and {p for p, _ in again} <= {str(frozen_port)}, (
        f"jobs with a committed result started again: {again}"
    )
    copies = copies_by_the_thawed(marks, str(frozen_port), at, SLOTS)
    assert not copies, f"the thawed agent ran copies of jobs run elsewhere: {copies}"


def copies_by_the_thawed(
    marks: list[tuple[str, str]], frozen: str, at: int, slots: int
) -> dict[str, list[tuple[int, str]]]:
    """The thawed agent's copies of jobs run elsewhere, if more than ``slots`` (else {}):
    job key -> (line, agent port) of each of its marks.

    A job the frozen agent ran (or finished, its result uncollected) before its node was
    given up on runs again: its result was never committed. The new master may place it
    anywhere, the thawed agent included: a second mark *there*, after one before the
    freeze, is that rerun (the agent never runs one execution twice), not a copy. A copy
    is a job the thawed agent ran after ``at`` that also ran on another agent, or that
    it ran twice after ``at`` (its old execution and a new one). One per slot may have
    left the queue just before the freeze (taken, its mark not yet written).
    """
    elsewhere = {key for port, key in marks if port != frozen}
    after = Counter(key for port, key in marks[at:] if port == frozen)
    copies = sorted(key for key, n in after.items() if key in elsewhere or n > 1)
    if len(copies) <= slots:
        return {}
    return {key: [(i, port) for i, (port, k) in enumerate(marks) if k == key] for key in copies}


@pytest.mark.parametrize("point", KILL_POINTS)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # PostgreSQL: serving, below
def test_one_shot_master_killed_on_the_gone_node_path(
    store: Store, agents: Any, db_url: str, tmp_path: Path, point: str
) -> None:
    path = tmp_path / "marks.txt"
    add_mark_jobs(store, path, count=JOBS, seconds=SECONDS)
    frozen, _ = agents(2, slots=SLOTS)
    env = master_env(db_url)
    first = spawn_jodl(
        "run", "mark", log_path=tmp_path / "master0.log", env={**env, "JODL_FAILPOINT": point}
    )
    try:
        freeze_when_busy(path, frozen)
        assert exit_code(first, tmp_path, 60) == -signal.SIGKILL, logs(tmp_path)
        committed, at = committed_keys(store), len(marks_of(path))
        os.kill(frozen.pid, signal.SIGCONT)
        again = spawn_jodl("run", "mark", log_path=tmp_path / "master1.log", env=env)
        assert exit_code(again, tmp_path, 120) == 0, logs(tmp_path)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        stop_all([first])
    judge(store, path, frozen.port, committed, at)


@postgres
@pytest.mark.parametrize("point", KILL_POINTS)
def test_serving_leader_killed_on_the_gone_node_path_a_standby_finishes(
    store: Store, agents: Any, db_url: str, tmp_path: Path, point: str
) -> None:
    path = tmp_path / "marks.txt"
    add_mark_jobs(store, path, count=JOBS, seconds=SECONDS)
    frozen, _ = agents(2, slots=SLOTS)
    env = master_env(db_url)
    masters = [
        spawn_jodl(
            "master", log_path=tmp_path / "master0.log", env={**env, "JODL_FAILPOINT": point}
        )
    ]
    try:
        holder, _ = settled(store, 1)
        request = store.request_run("mark")
        # The standby joins with the run open: the family stays with its leader. (Before
        # the leader takes the request the family is idle, and hashing may hand it over.)
        wait_for(
            lambda: store.run_request(request).taken_by == holder,
            30,
            "the leader to take the requested run",
        )
        masters.append(spawn_jodl("master", log_path=tmp_path / "master1.log", env=env))
        freeze_when_busy(path, frozen)
        assert exit_code(masters[0], tmp_path, 60) == -signal.SIGKILL, logs(tmp_path)
        committed, at = committed_keys(store), len(marks_of(path))
        os.kill(frozen.pid, signal.SIGCONT)
        row = run_finished(store, request, tmp_path, "the standby to finish the run")
        assert row.taken_by != holder
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        stop_all(masters)
    judge(store, path, frozen.port, committed, at)


def old_epoch_rows(store: Store, epoch: int) -> int:
    with store.engine.connect() as conn:
        return conn.scalar(select(func.count()).where(Execution.epoch == epoch)) + conn.scalar(
            select(func.count()).where(Dispatch.epoch == epoch)
        )


def snapshot(store: Store, epoch: int) -> tuple[Any, ...]:
    """What a fenced master must leave alone: runs, nodes, its epoch's rows (less the
    nodes' last seen, which the serving leader stamps while it talks to them)."""
    table = Node.__table__
    with store.engine.connect() as conn:
        runs = conn.execute(select(Run.__table__).order_by(Run.id)).all()
        kept = [c for c in table.c if c.name != "last_seen"]
        nodes = conn.execute(select(*kept).order_by(table.c.id)).all()
    return runs, nodes, old_epoch_rows(store, epoch)


@postgres
def test_a_leader_thawed_after_its_standby_finished_writes_nothing_and_stands_by(
    store: Store, agents: Any, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "marks.txt"
    add_mark_jobs(store, path, count=120, seconds=SECONDS)
    agents(2, slots=SLOTS)
    masters: list[subprocess.Popen[bytes]] = start_masters(2, db_url, tmp_path)
    try:
        holder, epoch = settled(store, 2)
        (leader,) = [m for m in masters if m.pid == int(holder.split(":")[1])]
        request = store.request_run("mark")
        wait_for(lambda: len(committed_keys(store)) >= 20, 60, "the cycle to be under way")
        leader.send_signal(signal.SIGSTOP)
        run_finished(store, request, tmp_path, "the standby to finish the run")
        before = snapshot(store, epoch)
        leader.send_signal(signal.SIGCONT)
        # Thawed, it finds its epoch refused and stands by again (still running).
        wait_for(
            lambda: (
                "stops, standing by"
                in (tmp_path / f"master{masters.index(leader)}.log").read_text()
            ),
            30,
            f"the thawed leader to stand by\n{logs(tmp_path)}",
        )
        assert leader.poll() is None, logs(tmp_path)
        wait_for(lambda: holder in store.masters.live(), 30, "the thawed master's heartbeat again")
        assert snapshot(store, epoch) == before, "the thawed leader wrote after the takeover"
        # Once it stands by, the family may move back to it, with a new epoch.
        leaders = [m for m in status_masters(store) if "mark" in m["families"]]
        assert len(leaders) <= 1, leaders
        assert all(m["epoch"] > epoch for m in leaders), leaders
        assert (lease(store) or ("", epoch + 1))[1] > epoch
    finally:
        stop_all(masters)


def is_stopped(process: subprocess.Popen[bytes]) -> bool:
    """Whether ``process`` is stopped (SIGSTOP: state T)."""
    stat = Path(f"/proc/{process.pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


@postgres
def test_a_master_that_handed_everything_over_stands_by_and_takes_over_a_frozen_leader(
    store: Store, agents: Any, db_url: str, tmp_path: Path
) -> None:
    """The first master hands the family to the one hashing picks, and then leads
    nothing: it stands by as a master just started does (no write of its ended epoch,
    so it is never told it was taken over). The new leader freezes right after
    renewing its lease, mid-run: the renewal left no transaction open on the lease row,
    so the first master takes the family over and finishes the run, no job run twice."""
    path = tmp_path / "marks.txt"
    add_mark_jobs(store, path, count=JOBS * 4, seconds=SECONDS)
    agents(2, slots=SLOTS)
    env = master_env(db_url)
    first = spawn_jodl("master", log_path=tmp_path / "master0.log", env=env)
    masters = [first]
    try:
        holder, _ = settled(store, 1)
        # A second master hashing picks for the family (a new process until one is),
        # frozen by its 6th renewal (4 s after it leads, the run under way by then).
        while True:
            second = spawn_jodl(
                "master",
                log_path=tmp_path / f"master{len(masters)}.log",
                env={**env, "JODL_FAILPOINT_FREEZE": "lease_renewed:6"},
            )
            masters.append(second)
            name = f"{holder.split(':')[0]}:{second.pid}"
            if rendezvous(SCOPE, [holder, name]) == name:
                break
            stop_all([second])
        wait_for(lambda: (lease(store) or ("",))[0] == name, 30, "the family handed over")
        request = store.request_run("mark")
        wait_logged(lambda: is_stopped(second), tmp_path, 60, "the new leader to freeze")
        assert store.run_request(request).finished_at is None, "frozen after the run ended"
        committed, at = committed_keys(store), len(marks_of(path))
        row = run_finished(store, request, tmp_path, "the first master to finish the run")
        assert row.taken_by == holder
        os.kill(second.pid, signal.SIGCONT)
        wait_for(
            lambda: (
                "stops, standing by"
                in (tmp_path / f"master{masters.index(second)}.log").read_text()
            ),
            30,
            f"the thawed leader to stand by\n{logs(tmp_path)}",
        )
        first_log = (tmp_path / "master0.log").read_text()
        assert "leads nothing now: standing by" in first_log, logs(tmp_path)
        assert "taken over" not in first_log, logs(tmp_path)
    finally:
        stop_all(masters)
    after = executions(store)
    check_complete(store, after)
    check_marks(store, path, after)
    again = [key for _port, key in marks_of(path)[at:] if key in committed]
    assert not again, f"jobs with a committed result started again: {again}"


def test_a_serving_master_takes_each_result_once(
    store: Store, settings: Any, agents: Any, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """An agent reports a result on every call until it is acknowledged, and the ack
    waits for the log writer's commit: the repeats are skipped, not taken for results
    nobody awaited (a family that is not idempotent: no backup copies either)."""
    import logging
    import threading

    from jodl.master import Master

    add_mark_jobs(store, tmp_path / "marks.txt", count=3000, seconds=0.0)
    agents(2)
    master = Master(settings, store=store, name="serving")
    master.start()
    stop = threading.Event()
    thread = threading.Thread(target=master.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        with caplog.at_level(logging.INFO, logger="jodl.master"):
            summary = master.request_cycle("mark").result(timeout=120)
    finally:
        stop.set()
        thread.join(timeout=30)
        master.close()
    assert summary.done == 3000
    assert not [r for r in caplog.records if "not awaited" in r.getMessage()]
