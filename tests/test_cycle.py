"""Whole cycles on real agent subprocesses, checked against the reconstruction log."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from agents import free_port
from sqlalchemy import func, select

from jodl.exceptions import Fenced
from jodl.log import Store
from jodl.log.models import ExecState, Execution, Job, JobOnNode, JobState, NodeState, Run, RunState
from jodl.master import Master, RunSummary

CYCLE_JOBS = 1200


def add_jobs(store: Store, family: str, count: int, payload: str = "{}", **fields: object) -> int:
    fam = store.ensure_family(family, **fields)
    return store.add_jobs(fam, ((f"{family}-{i}", payload) for i in range(count)))


def done_per_job(store: Store, run_id: int) -> dict[int, int]:
    """job id -> number of 'done' executions in the run."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(Execution.job_id, func.count())
            .where(Execution.run_id == run_id, Execution.state == ExecState.DONE)
            .group_by(Execution.job_id)
        )
        return {job_id: count for job_id, count in rows}


def job_ids(store: Store, family_id: int) -> set[int]:
    with store.engine.connect() as conn:
        return set(conn.scalars(select(Job.id).where(Job.family_id == family_id)))


def test_cycle_of_1000_jobs_on_three_agents(store, agents, settings):
    add_jobs(store, "noop", CYCLE_JOBS)
    nodes = agents(3, slots=4)
    master = Master(settings, store=store)
    try:
        summary = master.run_cycle("noop")
    finally:
        master.close()

    assert (summary.total, summary.done, summary.dead) == (CYCLE_JOBS, CYCLE_JOBS, 0)
    family = store.family("noop")
    done = done_per_job(store, summary.run_id)
    assert set(done) == job_ids(store, family.id), "every job has a committed result"
    assert set(done.values()) == {1}, "no job has two committed results"
    with store.session() as s:
        run = s.get(Run, summary.run_id)
        assert run.state == RunState.FINISHED
        assert (run.jobs_total, run.jobs_done, run.jobs_dead) == (CYCLE_JOBS, CYCLE_JOBS, 0)
        per_node = dict(
            s.execute(
                select(Execution.node_id, func.count())
                .where(Execution.run_id == run.id, Execution.state == ExecState.DONE)
                .group_by(Execution.node_id)
            ).all()
        )
        open_execs = s.scalar(
            select(func.count()).where(
                Execution.run_id == run.id, Execution.state == ExecState.SENT
            )
        )
    assert len(per_node) == len(nodes), f"all three agents ran jobs: {per_node}"
    assert open_execs == 0


@pytest.mark.parametrize("window", [1, 7])
def test_a_run_read_in_windows_runs_each_job_once(store, agents, settings, window):
    """Windows of one job and of seven: the run reads on as its jobs finish, counts them
    all and ends once nothing is left to read; the next cycle does the same."""
    add_jobs(store, "noop", 40)
    agents(2, slots=2)
    master = Master(dataclasses.replace(settings, run_window=window), store=store)
    try:
        summaries = [master.run_cycle("noop"), master.run_cycle("noop")]
    finally:
        master.close()
    for summary in summaries:
        assert (summary.total, summary.done, summary.dead) == (40, 40, 0)
        done = done_per_job(store, summary.run_id)
        assert len(done) == 40 and set(done.values()) == {1}


def test_a_runs_later_pieces_are_read_ahead_beside_its_steps(store, agents, settings):
    """Past the first window (read at the open, before the first send), each piece of a
    run is read in a thread of its own while the loop goes on, from where the last one
    ended, and taken once: no piece read twice or for nothing, every job run once."""
    add_jobs(store, "noop", 40)
    agents(2, slots=2)
    reads: list[tuple[str, object]] = []
    real = store.run_window

    def spy(run, family, size, after=None, **kw):  # type: ignore[no-untyped-def]
        reads.append((threading.current_thread().name, after))
        return real(run, family, size, after=after, **kw)

    store.run_window = spy  # type: ignore[method-assign]
    master = Master(dataclasses.replace(settings, run_window=7), store=store)
    try:
        summary = master.run_cycle("noop")
    finally:
        master.close()
    assert (summary.total, summary.done, summary.dead) == (40, 40, 0)
    done = done_per_job(store, summary.run_id)
    assert len(done) == 40 and set(done.values()) == {1}
    assert reads[0] == (threading.current_thread().name, None)
    later = reads[1:]
    assert len(later) == 5  # 7 jobs each after the first window's 7, the last one 5
    assert {name for name, _after in later} == {"run-window"}
    assert len({after for _name, after in later}) == len(later)


def test_next_cycle_runs_every_job_again_and_keeps_learning(store, agents, settings):
    add_jobs(store, "sleep", 60, payload='{"seconds": 0.001}')
    agents(2, slots=2)
    master = Master(settings, store=store)
    try:
        first = master.run_cycle("sleep")
        second = master.run_cycle("sleep")
    finally:
        master.close()
    assert (first.number, second.number) == (1, 2)
    assert second.done == second.total == 60
    for run_id in (first.run_id, second.run_id):
        done = done_per_job(store, run_id)
        assert len(done) == 60 and set(done.values()) == {1}
    with store.engine.connect() as conn:
        learned = conn.scalar(select(func.sum(JobOnNode.executions)))
        last_runs = set(conn.scalars(select(Job.last_run_number)))
    assert learned == 120, "JobOnNode counts every execution of both cycles"
    # Jobs due in every cycle need no per-run bookkeeping (the log has their runs);
    # only every-N-cycles / minimum-interval jobs record their last run.
    assert last_runs == {None}


def test_failures_are_retried_and_hopeless_jobs_die(store, agents, settings):
    # flaky fails the first run of each key on each agent.
    flaky_family = store.ensure_family(
        "flaky", max_attempts=3, strategy_params={"attempts_before_move": 1}
    )
    store.add_jobs(flaky_family, ((f"k{i}", f'{{"times": 1, "key": "k{i}"}}') for i in range(20)))
    fam = store.ensure_family("fail", max_attempts=2)
    store.add_jobs(fam, [("bad-0", '{"message": "boom"}'), ("bad-1", '{"permanent": true}')])
    agents(2, slots=2)
    master = Master(settings, store=store)
    try:
        flaky = master.run_cycle("flaky")
        failing = master.run_cycle("fail")
    finally:
        master.close()
    assert (flaky.done, flaky.dead) == (20, 0)
    # A retry on the same agent would succeed (its second run of the key), so 40
    # failures mean every retry went to the other agent, as the master must do.
    assert flaky.failed == 40, "each job failed once on each agent, then succeeded"
    assert (failing.done, failing.dead) == (0, 2)
    with store.engine.connect() as conn:
        attempts = dict(
            conn.execute(
                select(Job.key, func.count())
                .join(Execution, Execution.job_id == Job.id)
                .where(Job.family_id == fam.id, Execution.state == ExecState.FAILED)
                .group_by(Job.key)
            ).all()
        )
        states = set(conn.scalars(select(Job.state).where(Job.family_id == fam.id)))
        errors = set(conn.scalars(select(Job.last_error).where(Job.family_id == fam.id)))
    assert attempts == {"bad-0": 2, "bad-1": 1}, "retryable twice, permanent once"
    assert states == {JobState.DEAD}
    assert any("boom" in (e or "") for e in errors)


def test_an_older_master_is_fenced_and_the_newer_one_finishes_its_run(store, agents, settings):
    add_jobs(store, "sleep", 40, payload='{"seconds": 0.01}')
    agents(2, slots=2)
    old = Master(settings, store=store, name="old")
    new = Master(settings, store=Store(store.engine), name="new", takeover=True)
    try:
        old.start()
        new.start()  # takes the lease: a newer epoch, announced to every agent
        assert new.epoch > old.epoch
        with pytest.raises(Fenced, match="newer master|another master took over"):
            old.run_cycle("sleep")
        summary = new.run_cycle("sleep")
    finally:
        old.close()
        new.close()
    # Fenced before its first write, the older master opened no run: the newer one did.
    assert not summary.resumed and summary.number == 1
    assert summary.done == summary.total == 40
    done = done_per_job(store, summary.run_id)
    assert len(done) == 40 and set(done.values()) == {1}
    assert {n.state for n in store.nodes()} == {NodeState.ACTIVE}, "fencing is not a node failure"


def test_a_fenced_master_stops_when_it_reconnects_too(store, spawn_agent, settings):
    # The older master cannot reach the agent at first; when it can, a newer master
    # has taken over: its reconnection is refused and it must stop, not retry forever.
    add_jobs(store, "noop", 5)
    port = free_port()
    store.add_node(f"127.0.0.1:{port}", slots=1)
    old = Master(settings, store=store, name="old")
    new = Master(settings, store=Store(store.engine), name="new", takeover=True)
    outcome: list[BaseException | RunSummary] = []
    try:
        old.start()
        spawn_agent(port=port)
        new.start()

        def run_old() -> None:
            try:
                outcome.append(old.run_cycle("noop"))
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                outcome.append(exc)

        runner = threading.Thread(target=run_old, daemon=True)
        runner.start()
        runner.join(timeout=30)
        assert not runner.is_alive(), "the fenced master kept retrying"
        assert isinstance(outcome[0], Fenced), outcome
        assert {n.state for n in store.nodes()} == {NodeState.ACTIVE}
        assert new.run_cycle("noop").done == 5
    finally:
        old.close()
        new.close()


def test_a_run_an_application_opened_is_new_to_the_master_not_resumed(store):
    fam = store.ensure_family("noop")
    store.add_jobs(fam, [("a", "{}")])
    opened, _ = store.open_run(fam, 0)  # as the page checker records its run's id first
    run, resumed = store.open_run(fam, 7)
    assert run.id == opened.id and not resumed
    again, resumed = store.open_run(fam, 8)  # a master worked on it: now it is resumed
    assert again.id == run.id and resumed


def test_a_large_run_sends_a_first_batch_before_placing_the_rest(store, agents, settings):
    """The first placement of a run takes one batch per agent; the rest is placed once
    that batch went out, and every job still runs exactly once."""
    settings = dataclasses.replace(settings, batch_size=10)
    add_jobs(store, "noop", 200)
    agents(2, slots=2)
    master = Master(settings, store=store)
    try:
        master.start()
        family = store.family("noop")
        run, _ = store.open_run(family, master.epoch)
        active = master.keeper.open(run, family, resumed=False)
        assert master.dispatcher.assign() == 20, "one batch of 10 per agent"
        assert master.book.n_waiting == 180
        assert master.dispatcher.assign() == 0, "the first batch waits queued: no more yet"
        while active.first_send is None:
            master.step()
        master.step()
        assert master.book.n_waiting == 0, "the rest placed in the step after the first send"
        while active.remaining > 0:
            master.step()
        summary = master.keeper.finish(active)
    finally:
        master.close()
    assert (summary.total, summary.done, summary.dead) == (200, 200, 0)
    done = done_per_job(store, summary.run_id)
    assert set(done) == job_ids(store, family.id)
    assert set(done.values()) == {1}, "no job has two committed results"


def test_a_master_tunes_the_interpreter_while_it_runs_and_restores_it(store, agents, settings):
    """The collector's threshold and the switch interval are the master's while it runs
    (its loop, log writer and calls share the interpreter), the process's again after."""
    import gc
    import sys

    from jodl.master.loop import GC_THRESHOLD, SWITCH_INTERVAL

    before = (gc.get_threshold(), sys.getswitchinterval())
    add_jobs(store, "noop", 20)
    agents(1)
    master = Master(settings, store=store)
    try:
        master.start()
        assert sys.getswitchinterval() == pytest.approx(min(SWITCH_INTERVAL, before[1]))
        assert gc.get_threshold()[0] >= GC_THRESHOLD
        assert master.run_cycle("noop").done == 20
    finally:
        master.close()
    assert (gc.get_threshold(), sys.getswitchinterval()) == before
