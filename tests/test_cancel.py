"""Cancel and delete at run time, judged by the marks jobs leave (the ``mark`` family).

A master process runs a cycle (``jodl run mark``); another command cancels it
(``jodl run cancel mark``) or deletes one of its jobs in flight (``jodl jobs
delete``). The marks file tells what really started on the agents, whatever the
log says; the log must agree.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from agents import run_jodl, spawn_jodl, wait_for
from app_support import add_users_tracking, agent_env
from sqlalchemy import func, select, update
from sqlalchemy.orm import sessionmaker

from crawler_app.users import pages
from crawler_app.users.pages import CHECK_FAMILY
from jodl.log import Store
from jodl.log.models import Dispatch, ExecState, Execution, Job, JobState, Run, RunState

pytest_plugins = ("tests.site",)

#: Jobs' slots on the one agent: few, so that most jobs of a cycle wait unsent or queued.
SLOTS = 2


def marked(path: Path) -> list[str]:
    """Keys of every job start the ``mark`` family wrote, in order (end lines skipped)."""
    if not path.exists():
        return []
    lines = [line.split(" ") for line in path.read_text().splitlines()]
    return [parts[1] for parts in lines if len(parts) == 2]


def add_marks(store: Store, path: Path, seconds: dict[str, float]) -> None:
    fam = store.ensure_family("mark")
    store.add_jobs(
        fam,
        (
            (key, json.dumps({"key": key, "path": str(path), "seconds": s}))
            for key, s in seconds.items()
        ),
    )


def executions(store: Store, key: str) -> list[str]:
    with store.engine.connect() as conn:
        return list(
            conn.scalars(
                select(Execution.state)
                .join(Job, Job.id == Execution.job_id)
                .where(Job.key == key)
                .order_by(Execution.id)
            )
        )


def runs(store: Store) -> list[tuple[int, str]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(Run.number, Run.state).order_by(Run.number))]


def stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


def test_cancel_mid_cycle_stops_the_run(store: Store, agents, db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "marks.txt"
    agents(1, slots=SLOTS)
    total = 60
    add_marks(store, path, {f"m{i}": 0.4 for i in range(total)})
    env = {"JODL_DATABASE_URL": db_url}
    master = spawn_jodl("run", "mark", log_path=tmp_path / "master.log", env=env)
    try:
        wait_for(lambda: len(marked(path)) >= 4, 60, "the cycle to start some jobs")
        cancel = run_jodl("run", "cancel", "mark", env=env)
        # The cancel is settled after the agent dropped its queue and the run closed:
        # from here on no job may start.
        after_cancel = len(marked(path))
        assert cancel.returncode == 0, cancel.stderr + cancel.stdout
        assert "cancelled" in cancel.stdout
        assert master.wait(timeout=60) == 0
        out = (tmp_path / "master.log").read_text()
        assert "mark#1 cancelled" in out
    finally:
        stop(master)
    assert runs(store) == [(1, RunState.CANCELLED)]
    # Jobs running when the cancel came stop early; nothing new starts: wait out longer
    # than one job's sleep, then look.
    time.sleep(1.0)  # an observation window (2.5 job sleeps), not a synchronisation
    keys = marked(path)
    assert len(keys) == after_cancel, "a job started after the cancel was taken"
    assert len(keys) < total, "queued jobs ran"
    assert max(Counter(keys).values()) == 1
    never = [f"m{i}" for i in range(total) if f"m{i}" not in set(keys)]
    for key in never:
        assert ExecState.DONE not in executions(store, key)
    # The jobs it did not run are due in the next run, which runs them all once.
    nxt = run_jodl("run", "mark", env=env)
    assert nxt.returncode == 0, nxt.stderr + nxt.stdout
    assert runs(store) == [(1, RunState.CANCELLED), (2, RunState.FINISHED)]
    assert sorted(set(marked(path))) == sorted(f"m{i}" for i in range(total))


def test_cancel_beside_a_serving_master(store: Store, agents, db_url: str, tmp_path: Path) -> None:
    """``jodl master`` serves; ``jodl run mark`` beside it asks for the cycle and follows
    it; ``jodl run cancel mark`` ends it and both commands say so."""
    path = tmp_path / "marks.txt"
    agents(1, slots=SLOTS)
    total = 40
    add_marks(store, path, {f"m{i}": 0.4 for i in range(total)})
    env = {"JODL_DATABASE_URL": db_url}
    master = spawn_jodl("master", log_path=tmp_path / "master.log", env=env)
    follower = None
    try:
        wait_for(lambda: store.lease_holder() is not None, 60, "the master to start")
        follower = spawn_jodl("run", "mark", log_path=tmp_path / "run.log", env=env)
        wait_for(lambda: len(marked(path)) >= 4, 60, "the cycle to start some jobs")
        cancel = run_jodl("run", "cancel", "mark", env=env)
        after_cancel = len(marked(path))
        assert cancel.returncode == 0, cancel.stderr + cancel.stdout
        assert "mark#1 cancelled" in cancel.stdout
        assert follower.wait(timeout=60) == 0
        assert "mark#1 cancelled" in (tmp_path / "run.log").read_text()
        assert runs(store) == [(1, RunState.CANCELLED)]
        time.sleep(1.0)  # an observation window (2.5 job sleeps), not a synchronisation
        assert len(marked(path)) == after_cancel < total
        assert master.poll() is None, "the serving master keeps serving"
    finally:
        if follower is not None:
            stop(follower)
        stop(master)


def test_cancel_stops_running_jobs_on_their_agent_and_frees_its_slots(
    store: Store, agents, db_url: str, tmp_path: Path
) -> None:
    """Jobs of a minute fill both slots; ``jodl run cancel`` stops them on the agent
    (the ``mark`` family hears it and writes no end line), so a cycle of another family
    on the same agent runs at once instead of waiting out the minute."""
    path = tmp_path / "marks.txt"
    agents(1, slots=SLOTS)
    fam = store.ensure_family("mark")
    store.add_jobs(
        fam,
        (
            (key, json.dumps({"key": key, "path": str(path), "seconds": 60.0, "end": True}))
            for key in ("long0", "long1")
        ),
    )
    store.add_jobs(store.ensure_family("sleep"), ((f"s{i}", '{"seconds": 0.1}') for i in range(4)))
    env = {"JODL_DATABASE_URL": db_url}
    master = spawn_jodl("run", "mark", log_path=tmp_path / "master.log", env=env)
    try:
        wait_for(lambda: len(marked(path)) == 2, 60, "both long jobs to start")
        cancel = run_jodl("run", "cancel", "mark", env=env)
        assert cancel.returncode == 0, cancel.stderr + cancel.stdout
        assert master.wait(timeout=60) == 0
    finally:
        stop(master)
    started = time.monotonic()
    # Both slots are taken until the long jobs end: this cycle runs only on freed slots.
    other = run_jodl("run", "sleep", env=env, timeout=50)
    took = time.monotonic() - started
    assert other.returncode == 0, other.stderr + other.stdout
    assert took < 30, f"the next cycle waited {took:.0f}s for the cancelled jobs' slots"
    lines = path.read_text().splitlines()
    assert sorted(marked(path)) == ["long0", "long1"], lines
    assert not [line for line in lines if line.endswith(" end")], "a cancelled job ran to its end"
    assert executions(store, "long0") == [ExecState.CANCELLED]


def test_cancel_without_a_master_closes_the_run(store: Store, db_url: str) -> None:
    fam = store.ensure_family("mark")
    store.open_run(fam, 0)
    env = {"JODL_DATABASE_URL": db_url}
    done = run_jodl("run", "cancel", "mark", env=env)
    assert done.returncode == 0, done.stderr
    assert runs(store) == [(1, RunState.CANCELLED)]
    again = run_jodl("run", "cancel", "mark", env=env)
    assert again.returncode != 0 and "no running cycle of mark" in again.stderr


def test_a_deleted_job_in_flight_is_cancelled_and_never_rerun(
    store: Store, agents, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "marks.txt"
    agents(1, slots=SLOTS)
    # m0 would run for a minute: the run ends long before it could, only if its
    # deletion cancelled it.
    add_marks(store, path, {"m0": 60.0, **{f"m{i}": 0.2 for i in range(1, 9)}})
    env = {"JODL_DATABASE_URL": db_url}
    master = spawn_jodl("run", "mark", log_path=tmp_path / "master.log", env=env)
    try:
        wait_for(lambda: "m0" in marked(path), 60, "m0 to start")
        deleted = run_jodl("jobs", "delete", "mark", "m0", env=env)
        assert deleted.returncode == 0, deleted.stderr
        assert master.wait(timeout=40) == 0, "the run waited for the deleted job"
    finally:
        stop(master)
    assert executions(store, "m0") == [ExecState.CANCELLED]
    with store.engine.connect() as conn:
        assert conn.scalar(select(Job.state).where(Job.key == "m0")) == JobState.DELETED
    again = run_jodl("run", "mark", env=env)
    assert again.returncode == 0, again.stderr + again.stdout
    keys = Counter(marked(path))
    assert keys["m0"] == 1, "the deleted job ran again"
    assert executions(store, "m0") == [ExecState.CANCELLED]
    missing = run_jodl("jobs", "delete", "mark", "m0", "nope", env=env)
    assert missing.returncode != 0 and "nope" in missing.stderr


def test_untracking_the_last_tracker_stops_the_check_job(
    store: Store, agents, db_url: str, site: Any, tmp_path: Path
) -> None:
    # The page answers slowly: its check is in flight when its last tracker leaves.
    site.set_page("/slow", "<p>hello</p>", delay=6.0)
    url = site.url("/slow")
    add_users_tracking(store, url, ["ann@example.org", "bob@example.org"])
    # `jodl run` runs the family without the page checker's cycle, which would mark the
    # job as one of users allowed the loopback allowlist (crawler_app.fetching.reach): mark it.
    with store.engine.begin() as conn:
        payload = json.dumps({"url": url, "reach": "allowlist"})
        conn.execute(update(Job).where(Job.key == url).values(payload=payload))
    agents(1, slots=SLOTS, env=agent_env())
    env = {"JODL_DATABASE_URL": db_url}
    master = spawn_jodl("run", CHECK_FAMILY, log_path=tmp_path / "master.log", env=env)
    sessions = sessionmaker(store.engine)
    try:
        with store.engine.connect() as conn:
            wait_for(
                lambda: conn.scalar(select(func.count()).select_from(Dispatch)),
                60,
                "the check to be sent",
            )
        with sessions.begin() as s:
            assert pages.untrack(s, "ann@example.org", url)
        with store.engine.connect() as conn:  # one tracker left: the job stays
            assert conn.scalar(select(Job.state).where(Job.key == url)) == JobState.IDLE
        with sessions.begin() as s:
            assert pages.untrack(s, "bob@example.org", url)
        # The run ends without waiting for the slow fetch: its job was cancelled.
        assert master.wait(timeout=60) == 0
    finally:
        stop(master)
    assert executions(store, url) == [ExecState.CANCELLED]
    with store.engine.connect() as conn:
        assert conn.scalar(select(Job.state).where(Job.key == url)) == JobState.DELETED
    again = run_jodl("run", CHECK_FAMILY, env=env)
    assert again.returncode == 0, again.stderr + again.stdout
    # The fetch that was in flight is logged when its slow answer is written; after
    # it nothing more asks for the page (the next cycle had no job for it).
    site.wait_requests("/slow", 1, timeout=30)
    assert len(site.requests("/slow")) == 1
    assert executions(store, url) == [ExecState.CANCELLED]
