"""Crash tests: a master or an agent SIGKILLed mid-cycle; invariants read from the log.

The master runs as ``jodl run mark`` in a subprocess and kills itself at a named
failpoint (``JODL_FAILPOINT=NAME:N``, see :mod:`jodl.failpoint`); it is then
started again without the failpoint and must finish the same run: every job ends
with exactly one committed result, and no job that had one before the kill is
sent again (the dispatch log, written before every send, is the evidence) nor
runs again (the line each real run of a ``mark`` job appends to a file).
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agents import TEST_SECRET, AgentProcess, run_jodl, spawn_jodl, wait_for
from sqlalchemy import func, select

from jodl.agent.wire import connect
from jodl.log import Store
from jodl.log.models import (
    Dispatch,
    ExecState,
    Execution,
    Job,
    MasterLease,
    Node,
    NodeState,
    Run,
    RunState,
)
from jodl.settings.config import Settings

JOBS = 60
#: Job length (seconds): long enough that a cycle takes many loop steps.
SECONDS = 0.05


def add_mark_jobs(store: Store, marks: Path, count: int = JOBS, seconds: float = SECONDS) -> None:
    """Jobs that append a line to ``marks`` when they really run (jodl.examples.Mark)."""
    fam = store.ensure_family("mark")
    store.add_jobs(
        fam,
        (
            (f"s{i}", json.dumps({"key": f"s{i}", "path": str(marks), "seconds": seconds}))
            for i in range(count)
        ),
    )


def runs_by_key(marks: Path) -> Counter[str]:
    """How many times each job really ran (its lines in the marks file)."""
    if not marks.exists():
        return Counter()
    return Counter(line.split(" ")[1] for line in marks.read_text().splitlines())


def check_marks(store: Store, marks: Path, after: dict[int, dict[str, Any]]) -> None:
    """The file agrees with the log: every job ran, and no more often than it was started."""
    with store.engine.connect() as conn:
        keys = dict(conn.execute(select(Job.id, Job.key)).tuples().all())
    ran = runs_by_key(marks)
    assert set(ran) == set(keys.values()), "every job ran at least once"
    started = Counter(
        keys[row["job_id"]] for row in after.values() if row["state"] != ExecState.TAKEN_BACK
    )
    more = {key: n for key, n in ran.items() if n > started[key]}
    assert not more, f"jobs ran more often than the log has executions for them: {more}"


def executions(store: Store) -> dict[int, dict[str, Any]]:
    """Every execution row by id (the evidence compared before and after a restart)."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(
                Execution.id,
                Execution.run_id,
                Execution.job_id,
                Execution.node_id,
                Execution.state,
                Execution.result,
                Execution.finished_at,
                Execution.error,
            )
        ).mappings()
        return {row["id"]: dict(row) for row in rows}


def next_exec_id(store: Store) -> int:
    """Every execution (and dispatch) created from now on has an id at least this large."""
    return store.next_free_exec_id()


def jobs_sent_since(store: Store, first_id: int) -> set[int]:
    """Jobs in the dispatches logged (write-ahead, before any send) from id ``first_id`` on."""
    with store.engine.connect() as conn:
        items = conn.scalars(select(Dispatch.items).where(Dispatch.id >= first_id))
        return {job_id for text in items for _exec, job_id, _attempt in json.loads(text)}


def check_complete(store: Store, after: dict[int, dict[str, Any]]) -> int:
    """One finished run; every job exactly one 'done' row, no dispatch left open. Its id."""
    with store.engine.connect() as conn:
        runs = conn.execute(select(Run.id, Run.state, Run.jobs_done)).all()
        all_jobs = set(conn.scalars(select(Job.id)))
        still_open = conn.scalar(select(func.count()).where(Dispatch.is_open))
    assert len(runs) == 1, "the restart resumed the run instead of opening a new one"
    run_id, state, jobs_done = runs[0]
    assert state == RunState.FINISHED
    assert still_open == 0, "every dispatched execution has an outcome"
    done: dict[int, int] = {}
    for row in after.values():
        assert row["run_id"] == run_id
        if row["state"] == ExecState.DONE:
            done[row["job_id"]] = done.get(row["job_id"], 0) + 1
    assert set(done) == all_jobs, "no job lost"
    assert set(done.values()) == {1}, "exactly one committed result per job"
    assert jobs_done == len(all_jobs)
    return run_id


def check_no_rerun(
    store: Store,
    before: dict[int, dict[str, Any]],
    after: dict[int, dict[str, Any]],
    first_new_id: int,
) -> None:
    """Results committed before the kill are unchanged and their jobs were not sent again."""
    done_before = {row["job_id"] for row in before.values() if row["state"] == ExecState.DONE}
    for eid, row in before.items():
        assert after[eid] == row, "an outcome committed before the kill changed"
    resent = done_before & jobs_sent_since(store, first_new_id)
    assert not resent, f"jobs with a committed result were sent again: {sorted(resent)[:5]}"
    new_rows = [
        row for eid, row in after.items() if eid >= first_new_id and row["job_id"] in done_before
    ]
    assert not new_rows, f"jobs with a committed result ran again: {new_rows[:3]}"


def agents_idle(store: Store, nodes: list[AgentProcess]) -> None:
    """Agent-side evidence: after the run nothing is queued or running on any agent."""
    with store.engine.connect() as conn:
        epoch = int(conn.scalar(select(func.max(MasterLease.epoch))) or 0)
    for agent in nodes:
        conn = connect(agent.address, Settings(call_timeout=10.0, secret=TEST_SECRET))
        try:
            queued, running, _done, _failed = conn.root.remaining(epoch)
        finally:
            conn.close()
        assert (queued, running) == (0, 0), f"{agent.address} still works after the run"


def done_keys(store: Store, rows: dict[int, dict[str, Any]]) -> set[str]:
    with store.engine.connect() as conn:
        keys = dict(conn.execute(select(Job.id, Job.key)).tuples().all())
    return {keys[row["job_id"]] for row in rows.values() if row["state"] == ExecState.DONE}


def kill_and_resume(
    store: Store,
    db_url: str,
    failpoints: list[str],
    nodes: list[AgentProcess],
    marks: Path,
    extra_env: dict[str, str] | None = None,
) -> None:
    """Run the master once per failpoint (each must kill it), then once to the end."""
    env = {"JODL_DATABASE_URL": db_url, "JODL_CALL_TIMEOUT": "5", **(extra_env or {})}
    before = executions(store)
    first_new_id = next_exec_id(store)
    committed: set[str] = set()
    ran_at_kill: Counter[str] = Counter()

    def check_not_run_again() -> None:
        ran = runs_by_key(marks)
        rerun = {key for key in committed if ran[key] != ran_at_kill[key]}
        assert not rerun, f"jobs committed before a kill ran again: {sorted(rerun)[:5]}"

    for point in failpoints:
        crashed = run_jodl("run", "mark", env={**env, "JODL_FAILPOINT": point})
        assert crashed.returncode == -signal.SIGKILL, (
            f"{point} did not kill the master mid-cycle:\n{crashed.stdout}{crashed.stderr}"
        )
        after = executions(store)
        check_no_rerun(store, before, after, first_new_id)
        # By the file: a job whose result was committed at a kill never runs again.
        check_not_run_again()
        committed, ran_at_kill = done_keys(store, after), runs_by_key(marks)
        before, first_new_id = after, next_exec_id(store)
    with store.engine.connect() as conn:
        total = conn.scalar(select(func.count()).select_from(Job))
    done_at_kill = sum(1 for row in before.values() if row["state"] == ExecState.DONE)
    assert done_at_kill < total, "the kill came after the cycle had finished"
    finished = run_jodl("run", "mark", env=env)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "(resumed)" in finished.stdout
    after = executions(store)
    check_no_rerun(store, before, after, first_new_id)
    check_complete(store, after)
    agents_idle(store, nodes)
    check_not_run_again()
    check_marks(store, marks, after)


FAILPOINTS = ["before_send:2", "after_log:2", "after_send:2", "before_commit:3", "after_commit:3"]


# One kill from a fresh start per point (on SQLite; the sequence below runs on both).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_master_killed_at_a_failpoint_resumes_without_redoing(
    store, agents, db_url, failpoint, tmp_path
):
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks)
    nodes = agents(2, slots=2)
    kill_and_resume(store, db_url, [failpoint], nodes, marks)


def test_master_killed_at_every_failpoint_in_turn_finishes_once(store, agents, db_url, tmp_path):
    # Enough jobs that the last kill still comes mid-cycle on a loaded machine, where
    # each commit holds more results (90 were all done at the fifth kill once).
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=150)
    nodes = agents(2, slots=2)
    points = [point.replace(":3", ":2") for point in FAILPOINTS]
    kill_and_resume(store, db_url, points, nodes, marks)


def test_a_run_resumed_in_two_parts_finishes_once(store, agents, db_url, tmp_path):
    """Batches of 4: a resumed run reads the jobs of its logged executions and a first
    batch per agent, sends, then reads the rest (most of the run) in the same step."""
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=120)
    nodes = agents(2, slots=2)
    points = ["after_send:3", "after_commit:4"]
    kill_and_resume(store, db_url, points, nodes, marks, extra_env={"JODL_BATCH_SIZE": "4"})


def test_a_run_read_in_windows_is_killed_and_resumed_and_finishes_once(
    store, agents, db_url, tmp_path
):
    """Windows of 9 members, batches of 4: the master holds a few windows of the run at a
    time, both before the kills (a run it opened: the log is not asked) and after them
    (a resumed run: each window leaves out what is done and what was read early)."""
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=100, seconds=0.02)
    nodes = agents(2, slots=2)
    points = ["after_commit:6", "after_send:5"]
    env = {"JODL_BATCH_SIZE": "4", "JODL_RUN_WINDOW": "9"}
    kill_and_resume(store, db_url, points, nodes, marks, extra_env=env)


def fail_an_agent_mid_cycle(store, agents, db_url, tmp_path, hang: bool) -> None:  # type: ignore[no-untyped-def]
    """Kill (SIGKILL) or hang (SIGSTOP) one of three agents mid-cycle; the run must finish."""
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=90 if hang else 150)
    victim, *_ = agents(3, slots=2)
    with store.session() as s:
        victim_id = s.scalar(select(Node.id).where(Node.address == victim.address))
    master = spawn_jodl(
        "run",
        "mark",
        log_path=tmp_path / "master.log",
        env={"JODL_DATABASE_URL": db_url, "JODL_CALL_TIMEOUT": "2" if hang else "5"},
    )
    try:

        def victim_busy() -> bool:
            with store.engine.connect() as conn:
                done = conn.scalar(
                    select(func.count()).where(
                        Execution.node_id == victim_id, Execution.state == ExecState.DONE
                    )
                )
                in_flight = conn.scalar(
                    select(func.count()).where(Dispatch.node_id == victim_id, Dispatch.is_open)
                )
            assert master.poll() is None, (tmp_path / "master.log").read_text()
            return bool(done and done >= 3 and in_flight)

        wait_for(victim_busy, timeout=60, what="the victim agent to be mid-cycle")
        if hang:
            victim.proc.send_signal(signal.SIGSTOP)
        else:
            victim.kill()
        assert master.wait(timeout=90) == 0, (tmp_path / "master.log").read_text()
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
        if hang:
            victim.proc.send_signal(signal.SIGCONT)

    after = executions(store)
    check_complete(store, after)
    lost = [row for row in after.values() if row["state"] == ExecState.LOST]
    assert lost, "the failed agent's executions were closed as lost"
    assert all(row["node_id"] == victim_id for row in lost)
    done_node = {
        row["job_id"]: row["node_id"] for row in after.values() if row["state"] == ExecState.DONE
    }
    assert all(done_node[row["job_id"]] != victim_id for row in lost), (
        "a job lost with the victim finished on another agent"
    )
    with store.session() as s:
        assert s.get(Node, victim_id).state == NodeState.UNREACHABLE
    check_marks(store, marks, after)


def test_agent_killed_mid_cycle_its_jobs_finish_elsewhere(store, agents, db_url, tmp_path):
    fail_an_agent_mid_cycle(store, agents, db_url, tmp_path, hang=False)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_agent_hung_mid_cycle_its_jobs_finish_elsewhere(store, agents, db_url, tmp_path):
    fail_an_agent_mid_cycle(store, agents, db_url, tmp_path, hang=True)
