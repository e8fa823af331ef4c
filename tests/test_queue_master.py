"""The on-demand queue end to end: a serving master, real agent subprocesses.

A master runs ``serve()`` in a thread (or ``jodl master`` in a subprocess that
is SIGKILLed) with a :class:`QueueFeeder`; jobs are enqueued while it runs and
everything is checked from the database and from the agents themselves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agents import spawn_jodl, wait_for
from sqlalchemy import func, select

from jodl.agent.wire import connect
from jodl.log import Store
from jodl.log.models import Dispatch, ExecState, Execution, Job, JobState, utcnow
from jodl.log.records import OutcomeBatch
from jodl.master import Master
from jodl.queue import Queue, QueueFeeder
from jodl.settings.config import Settings


@contextmanager
def serving(master: Master, lease: float = 30.0) -> Iterator[Master]:
    """Run ``master.serve()`` with a queue feeder in a thread; re-raise what it raised."""
    master.feeders.append(QueueFeeder(Queue(master.store), lease=lease))
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            master.serve(stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, name="master", daemon=True)
    thread.start()
    try:
        yield master
    finally:
        stop.set()
        master.wake()  # out of its pause, to see the stop
        thread.join(timeout=30)
        master.close()
    if errors:
        raise errors[0]


def executions_of(store: Store, job_id: int) -> list[tuple[int, str, Any]]:
    """(execution id, state, result) of every attempt of a job, oldest first."""
    with store.engine.connect() as conn:
        return [
            (r[0], r[1], json.loads(r[2]) if r[2] else None)
            for r in conn.execute(
                select(Execution.id, Execution.state, Execution.result)
                .where(Execution.job_id == job_id)
                .order_by(Execution.id)
            )
        ]


def dispatched(store: Store, job_id: int) -> list[int]:
    """Execution ids under which a job was sent to an agent (from the dispatch log)."""
    with store.engine.connect() as conn:
        items = conn.scalars(select(Dispatch.items).where(Dispatch.run_id.is_(None))).all()
    return [e for text in items for e, j, _attempt in json.loads(text) if j == job_id]


def test_enqueued_jobs_run_on_agents(store: Store, agents, settings: Settings) -> None:
    agents(2, slots=4)
    store.ensure_family("fail", max_attempts=2)
    queue = Queue(store)
    with serving(Master(settings, store=store)):
        ids = queue.enqueue_many("sleep", [(f"s{i}", {"seconds": 0}) for i in range(300)])
        bad = queue.enqueue("fail", "always", {"message": "broken on purpose"})
        hopeless = queue.enqueue("fail", "permanent", {"permanent": True})
        wait_for(
            lambda: queue.counts().get("sleep", {}).get("done") == 300,
            timeout=60,
            what="300 on-demand jobs done",
        )
        wait_for(
            lambda: queue.counts().get("fail", {}).get("dead") == 2,
            timeout=60,
            what="the failing jobs dead",
        )
        # Enqueued while the master idles: picked up without a restart.
        late = queue.enqueue("sleep", "late", {"seconds": 0})
        wait_for(lambda: queue.get("sleep", "late").state == JobState.DONE, what="a late job")

    for job_id in [*ids[:20], late]:
        outcomes = executions_of(store, job_id)
        assert [s for _, s, _ in outcomes] == [ExecState.DONE]
        assert outcomes[0][2] == {"slept": 0.0}
    assert queue.result("sleep", "s7") == {"slept": 0.0}
    counts = queue.counts()
    assert counts["sleep"] == {"queued": 0, "running": 0, "overdue": 0, "dead": 0, "done": 301}
    with store.engine.connect() as conn:  # each job's home: the node that ran it
        homes = dict(
            conn.execute(select(Job.id, Job.permanent_node_id).where(Job.id.in_(ids))).all()
        )
        ran_on = dict(
            conn.execute(
                select(Execution.job_id, Execution.node_id).where(
                    Execution.job_id.in_(ids), Execution.state == ExecState.DONE
                )
            ).all()
        )
    assert homes == ran_on and None not in homes.values()
    always = queue.get("fail", "always")
    assert always is not None and always.failures == 2 and always.id == bad
    assert "broken on purpose" in (always.last_error or "")
    assert [s for _, s, _ in executions_of(store, bad)] == [ExecState.FAILED] * 2
    assert [s for _, s, _ in executions_of(store, hopeless)] == [ExecState.FAILED]  # no retry


def test_a_job_enqueued_while_the_master_idles_does_not_wait_for_the_pause_to_end(
    store: Store, agents, settings: Settings
) -> None:
    """The queue's claiming thread wakes the serving master: with a pause between idle
    loop steps of a minute, a job enqueued while it idles is still done well before."""
    agents(1)
    queue = Queue(store)
    with serving(Master(dataclasses.replace(settings, idle_sleep=60.0), store=store)) as master:
        wait_for(lambda: any(s.usable for s in master.nodes.values()), 30, "the agent")
        queue.enqueue("sleep", "now", {"seconds": 0})
        wait_for(lambda: queue.get("sleep", "now").state == JobState.DONE, 30, "the job done")


def test_jobs_of_a_killed_master_come_back_when_the_lease_ends(
    store: Store, agents, settings: Settings, db_url: str, tmp_path
) -> None:
    agents(1, slots=8)
    queue = Queue(store)
    ids = queue.enqueue_many("sleep", [(f"s{i}", {"seconds": 0.3}) for i in range(6)])
    master = spawn_jodl(
        "master",
        log_path=tmp_path / "master.log",
        env={"JODL_DATABASE_URL": db_url, "JODL_QUEUE_LEASE": "3"},
    )
    try:
        wait_for(
            lambda: all(dispatched(store, j) for j in ids),
            timeout=60,
            what="every job sent to the agent by the first master",
        )
    finally:
        master.send_signal(signal.SIGKILL)
        master.wait(timeout=10)
    # The dead master's claims hold their jobs until their lease ends.
    held = {j.id: j for j in queue.jobs("sleep", state=JobState.CLAIMED)}
    with serving(Master(settings, store=store)):
        wait_for(
            lambda: queue.counts().get("sleep", {}).get("done") == 6,
            timeout=60,
            what="the jobs taken over after the lease ended",
        )
    for job_id in ids:
        job = next(j for j in queue.jobs("sleep", state=JobState.DONE) if j.id == job_id)
        if job_id in held:  # it came back through its ended lease: one failure counted
            assert job.attempts == 2
            assert [s for _, s, _ in executions_of(store, job_id)] == [ExecState.DONE]
    assert held, "the killed master held claims"


class GatedStore(Store):
    """A store whose first commit of an on-demand result waits for the test's go-ahead.

    It stands for a master that collected a result and then stalled (a long GC
    pause, a frozen VM) before committing it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrived = threading.Event()
        self.go = threading.Event()

    def record_outcomes(self, *batches: OutcomeBatch) -> None:
        if any(batch.claims_done for batch in batches) and not self.arrived.is_set():
            self.arrived.set()
            self.go.wait(60)
        super().record_outcomes(*batches)


def test_a_late_result_of_a_superseded_attempt_changes_nothing(
    store: Store, agents, settings: Settings
) -> None:
    agents(1, slots=2)
    gated = GatedStore(store.engine)
    queue = Queue(store)
    job_id = queue.enqueue("sleep", "slow-master", {"seconds": 0})
    with serving(Master(settings, store=gated)):
        assert gated.arrived.wait(60), "the master collected the result"
        # Meanwhile the lease ends and another consumer claims the job: attempt 2.
        # (Its clock is past the lease, so the job it re-queues is not yet due for
        # the stalled master's feeder, which lives in real time.)
        later = Queue(store, clock=lambda: utcnow() + dt.timedelta(seconds=31))
        assert later.release_expired() == 1
        (second,) = later.claim(1, 30.0, families=["sleep"])
        assert (second.id, second.attempt, second.failures) == (job_id, 2, 1)
        gated.go.set()  # the stalled master commits attempt 1's result now
        wait_for(
            lambda: any(s == ExecState.DONE for _, s, _ in executions_of(store, job_id)),
            what="the stalled master's commit",
        )
        job = queue.get("sleep", "slow-master")
        assert job is not None
        assert (job.state, job.attempts, job.failures) == (JobState.CLAIMED, 2, 1)
        assert later.complete(second.id, second.attempt, {"by": "attempt 2"})
    job = queue.get("sleep", "slow-master")
    assert job is not None and job.state == JobState.DONE
    assert queue.result("sleep", "slow-master") == {"by": "attempt 2"}


def test_a_deleted_job_is_never_dispatched_and_is_cancelled_on_its_agent(
    store: Store, agents, settings: Settings
) -> None:
    (agent,) = agents(1, slots=2)
    queue = Queue(store)
    master = Master(settings, store=store)
    with serving(master):
        running = queue.enqueue("sleep", "long", {"seconds": 30})
        wait_for(lambda: dispatched(store, running), what="the long job sent")
        (exec_id,) = dispatched(store, running)
        waiting = queue.enqueue("sleep", "deleted-before-due", {"seconds": 0}, delay=1.0)
        after = queue.enqueue("sleep", "after", {"seconds": 0}, delay=1.5)
        assert queue.delete("sleep", "deleted-before-due")
        assert queue.delete("sleep", "long")
        wait_for(
            lambda: [s for _, s, _ in executions_of(store, running)] == [ExecState.CANCELLED],
            what="the running job cancelled",
        )
        conn = connect(agent.address, settings)
        try:
            assert conn.root.held(master.epoch, (exec_id,)) == ()
        finally:
            conn.close()
        wait_for(lambda: queue.get("sleep", "after").state == JobState.DONE, what="a later job")
        assert running not in master.pending
    assert dispatched(store, running) == [exec_id]  # sent once, never again
    assert dispatched(store, waiting) == []
    assert executions_of(store, waiting) == []
    assert executions_of(store, after)[0][1] == ExecState.DONE
    with store.engine.connect() as conn:
        cancelled = conn.scalar(select(func.count()).where(Execution.state == ExecState.CANCELLED))
    assert cancelled == 1


def test_a_master_that_stops_gives_its_unfinished_jobs_back_at_once(
    store: Store, agents, settings: Settings
) -> None:
    agents(1, slots=1)
    queue = Queue(store)
    ids = queue.enqueue_many("sleep", [(f"s{i}", {"seconds": 30}) for i in range(3)])
    with serving(Master(settings, store=store), lease=300.0):
        wait_for(lambda: dispatched(store, ids[0]) or dispatched(store, ids[1]), what="a send")
        wait_for(
            lambda: queue.counts()["sleep"]["running"] == 3, what="every job claimed by the master"
        )
    # Not after a 300 s lease: at once, and a shutdown is not a failure of the jobs.
    jobs = queue.jobs("sleep")
    assert [(j.state, j.failures, j.attempts) for j in jobs] == [(JobState.QUEUED, 0, 1)] * 3
