"""A cycle job's due time (``Job.due_at``): a run leaves out the idle jobs not due yet,
takes them once due, and jobs without one run in every cycle as before."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from jodl.log import JobLog, Store, utcnow
from jodl.log.models import ExecState, Execution, Job
from jodl.master import Master


def keys_of_run(store: Store, family: str) -> set[str]:
    fam = store.family(family)
    assert fam is not None
    run, _ = store.open_run(fam, epoch=1)
    return {job.key for job in store.run_jobs(run, family)}


def set_due(store: Store, family: str, due: dict[str, dt.datetime | None]) -> int:
    with store.engine.begin() as conn:
        return JobLog.set_due(conn, JobLog.family_id(conn, family), due)


def test_a_run_leaves_out_jobs_not_due_and_jobs_without_a_due_time_run_as_before(store):
    fam = store.ensure_family("due")
    store.add_jobs(fam, {"later": {}, "past": {}, "plain": {}})
    now = utcnow()
    later = now + dt.timedelta(hours=1)
    assert set_due(store, "due", {"later": later, "past": now - dt.timedelta(minutes=1)}) == 2
    assert store.reads.next_due("due") == now - dt.timedelta(minutes=1)

    assert keys_of_run(store, "due") == {"past", "plain"}
    run = store.running_run("due")
    assert run is not None and run.jobs_total == 2
    store.finish_run(run, None, None)

    # Once its time has come, the held-back job is taken with the others.
    set_due(store, "due", {"later": utcnow() - dt.timedelta(seconds=1), "past": None})
    assert keys_of_run(store, "due") == {"later", "past", "plain"}
    set_due(store, "due", {"later": None})
    assert store.reads.next_due("due") is None


def test_a_due_time_is_set_by_key_within_its_family_only(store):
    store.add_jobs(store.ensure_family("due"), {"a": {}})
    store.add_jobs(store.ensure_family("other"), {"a": {}})
    assert set_due(store, "due", {"a": utcnow() + dt.timedelta(days=1), "missing": None}) == 1
    assert keys_of_run(store, "other") == {"a"}
    assert keys_of_run(store, "due") == set()
    other = store.family("other")
    assert other is not None
    with store.engine.connect() as conn:
        assert conn.scalar(select(Job.due_at).where(Job.family_id == other.id)) is None


def test_a_master_cycle_runs_only_the_due_jobs_on_agents(store, agents, settings):
    fam = store.ensure_family("sleep")
    store.add_jobs(fam, {f"sleep-{i}": {"seconds": 0.001} for i in range(6)})
    set_due(store, "sleep", {f"sleep-{i}": utcnow() + dt.timedelta(hours=1) for i in range(3)})
    agents(1, slots=2)
    master = Master(settings, store=store)
    try:
        first = master.run_cycle("sleep")
        set_due(store, "sleep", {"sleep-0": utcnow() - dt.timedelta(seconds=1)})
        second = master.run_cycle("sleep")
    finally:
        master.close()
    with store.engine.connect() as conn:
        ran = [
            set(
                conn.scalars(
                    select(Job.key)
                    .join(Execution, Execution.job_id == Job.id)
                    .where(Execution.run_id == run_id, Execution.state == ExecState.DONE)
                )
            )
            for run_id in (first.run_id, second.run_id)
        ]
    assert ran[0] == {"sleep-3", "sleep-4", "sleep-5"}
    assert ran[1] == {"sleep-0", "sleep-3", "sleep-4", "sleep-5"}
    assert (first.total, second.total) == (3, 4)
