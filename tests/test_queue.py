"""The on-demand queue's semantics, on SQLite and on real PostgreSQL.

Time is a fake clock handed to the queue, so due times, leases and backoffs are
exercised without sleeping. The stateful test drives the queue with random
enqueues, claims, completions, failures, deletions and lease expiries against
an in-memory model and checks, after every step, that no key has two rows, no
key is lost and the counts agree.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import event, func, select, text

from jodl.exceptions import BadPayload
from jodl.log.engine import make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import Job, JobState
from jodl.log.outcomes import retry_delay
from jodl.log.store import Store
from jodl.queue import Queue
from tests.clock import Clock
from tests.plans import plan_nodes

START = dt.datetime(2030, 1, 1, 12, 0, 0)
LEASE = 60.0


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def queue(store: Store, clock: Clock) -> Iterator[Queue]:
    q = Queue(store, clock=clock, max_attempts=3, poll=0.01)
    yield q
    q.close()


def state_of(q: Queue, family: str, key: str) -> str | None:
    job = q.get(family, key)
    return job.state if job else None


# -- enqueue ------------------------------------------------------------------------------------


def test_enqueue_is_unique_and_moves_the_due_time(queue: Queue, clock: Clock) -> None:
    first = queue.enqueue("noop", "a", {"n": 1}, delay=30, priority=1)
    again = queue.enqueue("noop", "a", {"n": 2}, delay=5, priority=0)
    assert again == first
    job = queue.get("noop", "a")
    assert job is not None
    assert job.state == JobState.QUEUED
    assert job.due_at == clock.now + dt.timedelta(seconds=5)  # moved earlier
    assert job.priority == 1  # only ever raised while it waits
    queue.enqueue("noop", "a", {"n": 3}, delay=120, priority=4)
    job = queue.get("noop", "a")
    assert job is not None
    assert job.due_at == clock.now + dt.timedelta(seconds=120)  # and later
    assert job.priority == 4
    assert queue.counts()["noop"]["queued"] == 1
    clock.advance(120)
    (claimed,) = queue.claim(5, LEASE)
    assert claimed.payload == '{"n":3}'  # the last payload wins


def test_enqueue_many_counts_a_repeated_key_once(queue: Queue) -> None:
    ids = queue.enqueue_many("noop", ["a", ("b", {"x": 1}), ("a", {"y": 2})])
    assert len(ids) == 2 and len(set(ids)) == 2
    assert queue.counts()["noop"]["queued"] == 2
    assert queue.enqueue_many("noop", []) == []


def test_enqueue_refuses_a_payload_that_is_not_a_json_object(queue: Queue) -> None:
    with pytest.raises(BadPayload):
        queue.enqueue("noop", "a", "[1, 2]")
    with pytest.raises(BadPayload):
        queue.enqueue("noop", "a", {"when": dt.datetime.now()})
    assert queue.counts() == {}  # refused before anything was written


# -- claim -------------------------------------------------------------------------------------


def test_claim_takes_due_jobs_by_priority_then_due_time(queue: Queue, clock: Clock) -> None:
    queue.enqueue("noop", "late", delay=10)
    queue.enqueue("noop", "low", delay=0)
    clock.advance(1)
    queue.enqueue("noop", "high", delay=0, priority=5)
    queue.enqueue("noop", "older", due_at=START - dt.timedelta(seconds=60))
    got = [c.key for c in queue.claim(2, LEASE)]
    assert got == ["high", "older"]
    assert [c.key for c in queue.claim(5, LEASE)] == ["low"]  # "late" is not due yet
    assert queue.claim(5, LEASE) == []
    clock.advance(10)
    (late,) = queue.claim(5, LEASE)
    assert late.key == "late" and late.attempt == 1 and late.failures == 0


def test_claim_only_of_the_given_families(queue: Queue) -> None:
    queue.enqueue("noop", "a")
    queue.enqueue("sleep", "b")
    assert [c.family for c in queue.claim(5, LEASE, families=["sleep", "unknown"])] == ["sleep"]
    assert queue.claim(5, LEASE, families=["unknown"]) == []


def test_complete_is_guarded_by_the_attempt(queue: Queue, clock: Clock) -> None:
    queue.enqueue("noop", "a")
    (first,) = queue.claim(1, LEASE)
    clock.advance(LEASE + 1)
    assert queue.release_expired() == 1  # its holder went silent: back in the queue
    (second,) = queue.claim(1, LEASE)
    assert second.attempt == first.attempt + 1 and second.failures == 1
    assert queue.complete(first.id, first.attempt, {"stale": True}) is False
    assert queue.fail(first.id, first.attempt, "late error") is None
    assert state_of(queue, "noop", "a") == JobState.CLAIMED
    assert queue.result("noop", "a") is None
    assert queue.complete(second.id, second.attempt, {"fresh": True}) is True
    assert state_of(queue, "noop", "a") == JobState.DONE
    assert queue.result("noop", "a") == {"fresh": True}
    assert queue.complete(second.id, second.attempt) is False  # done once only


def test_failures_back_off_then_the_job_is_dead_and_requeueable(queue: Queue, clock: Clock) -> None:
    queue.enqueue("noop", "a")
    for failure in (1, 2):
        (c,) = queue.claim(1, LEASE)
        assert queue.fail(c.id, c.attempt, f"boom {failure}") == JobState.QUEUED
        assert queue.claim(1, LEASE) == []  # backing off
        job = queue.get("noop", "a")
        assert job is not None
        assert job.due_at == clock.now + dt.timedelta(seconds=retry_delay(failure))
        assert job.failures == failure and job.last_error == f"boom {failure}"
        clock.advance(retry_delay(failure))
    (c,) = queue.claim(1, LEASE)
    assert queue.fail(c.id, c.attempt, "boom 3") == JobState.DEAD
    counts = queue.counts()["noop"]
    assert counts["dead"] == 1 and counts["queued"] == 0
    assert [j.key for j in queue.jobs("noop", state=JobState.DEAD)] == ["a"]
    assert queue.requeue_dead("noop") == 1
    (c,) = queue.claim(1, LEASE)
    assert c.failures == 0 and c.attempt == 4  # a fresh budget, attempts never reused
    assert queue.fail(c.id, c.attempt, "bad input", retryable=False) == JobState.DEAD


def test_ended_leases_count_as_failures(queue: Queue, clock: Clock) -> None:
    queue.enqueue("noop", "a")
    for _ in range(3):
        assert len(queue.claim(1, LEASE)) == 1
        clock.advance(LEASE + 1)
        queue.release_expired()
    assert state_of(queue, "noop", "a") == JobState.DEAD
    job = queue.get("noop", "a")
    assert job is not None and "lease" in (job.last_error or "")


def test_extend_renews_only_claims_still_held(queue: Queue, clock: Clock) -> None:
    queue.enqueue_many("noop", ["a", "b"])
    a, b = queue.claim(2, LEASE)
    assert queue.delete("noop", "b")
    assert queue.extend([(a.id, a.attempt), (b.id, b.attempt)], LEASE) == {a.id}
    clock.advance(LEASE - 1)
    assert queue.extend([(a.id, a.attempt)], LEASE) == {a.id}
    clock.advance(LEASE - 1)
    assert queue.release_expired() == 0  # renewed in time
    assert queue.still_claimed([(a.id, a.attempt), (a.id, a.attempt + 1)]) == {a.id}


def test_claims_given_back_are_queued_again_with_no_failure(queue: Queue) -> None:
    """More claims than one statement's list held (a master's close gives back all it
    holds): only the attempts that still hold their job go back, none counts a failure."""
    queue.enqueue_many("noop", [f"k{i}" for i in range(1500)])
    claims = queue.claim(1500, LEASE)
    assert len(claims) == 1500
    assert queue.release([(c.id, c.attempt + 1) for c in claims[:10]]) == 0  # stale attempts
    assert queue.still_claimed((c.id, c.attempt) for c in claims) == {c.id for c in claims}
    assert queue.release([(c.id, c.attempt) for c in claims]) == 1500
    assert queue.still_claimed((c.id, c.attempt) for c in claims) == set()
    again = {c.id: c for c in queue.claim(2000, LEASE)}
    assert again.keys() == {c.id for c in claims}
    assert all(again[c.id].attempt == c.attempt + 1 and again[c.id].failures == 0 for c in claims)


def test_enqueue_while_running_runs_it_once_more(queue: Queue, clock: Clock) -> None:
    queue.enqueue("noop", "a", {"v": 1})
    (c,) = queue.claim(1, LEASE)
    queue.enqueue("noop", "a", {"v": 2}, delay=30)
    assert state_of(queue, "noop", "a") == JobState.CLAIMED
    assert queue.complete(c.id, c.attempt) is True
    job = queue.get("noop", "a")
    assert job is not None and job.state == JobState.QUEUED
    assert job.due_at == clock.now + dt.timedelta(seconds=30)
    clock.advance(30)
    (again,) = queue.claim(1, LEASE)
    assert again.payload == '{"v":2}' and again.attempt == c.attempt + 1


def test_done_and_dead_jobs_are_queued_afresh(queue: Queue) -> None:
    queue.enqueue("noop", "a", priority=3)
    (c,) = queue.claim(1, LEASE)
    queue.complete(c.id, c.attempt)
    assert state_of(queue, "noop", "a") == JobState.DONE
    queue.enqueue("noop", "a", priority=1)
    job = queue.get("noop", "a")
    assert job is not None and job.state == JobState.QUEUED and job.priority == 1
    (c,) = queue.claim(1, LEASE)
    queue.fail(c.id, c.attempt, "no", retryable=False)
    queue.enqueue("noop", "a")
    job = queue.get("noop", "a")
    assert job is not None and job.state == JobState.QUEUED and job.failures == 0
    assert job.last_error is None


def test_delete_stops_a_job_and_a_later_enqueue_revives_it(queue: Queue) -> None:
    queue.enqueue_many("noop", ["a", "b"])
    assert queue.delete("noop", "a") is True
    assert queue.delete("noop", "a") is False
    assert queue.delete("noop", "missing") is False
    assert queue.delete("nofamily", "a") is False
    assert [c.key for c in queue.claim(5, LEASE)] == ["b"]
    assert queue.delete("noop", "b") is True  # while claimed
    assert "noop" not in queue.counts()  # deleted jobs are not part of the queue
    zero = {"queued": 0, "running": 0, "overdue": 0, "dead": 0, "done": 0}
    assert queue.counts("noop") == {"noop": zero}
    queue.enqueue("noop", "a")
    assert [c.key for c in queue.claim(5, LEASE)] == ["a"]


def test_counts_per_family(queue: Queue, clock: Clock) -> None:
    queue.enqueue_many("noop", ["a", "b", "c", "d"])
    queue.enqueue("noop", "later", delay=3600)
    queue.enqueue("sleep", "s")
    a, b, c = queue.claim(3, LEASE, families=["noop"])
    queue.complete(a.id, a.attempt)
    queue.fail(b.id, b.attempt, "x", retryable=False)
    clock.advance(5)
    assert queue.counts() == {
        "noop": {"queued": 2, "running": 1, "overdue": 1, "dead": 1, "done": 1},
        "sleep": {"queued": 1, "running": 0, "overdue": 1, "dead": 0, "done": 0},
    }
    assert list(queue.counts("sleep")) == ["sleep"]


def test_wait_wakes_on_enqueue_and_times_out_when_idle(queue: Queue) -> None:
    real = Queue(queue.store, max_attempts=3, poll=0.01)  # real time: waiting is real
    try:
        assert real.wait(0.05) is False
        timer = threading.Timer(0.1, lambda: real.enqueue("noop", "a"))
        timer.start()
        started = time.monotonic()
        assert real.wait(30.0) is True
        timer.join()
        assert time.monotonic() - started < 30.0
        assert real.wait(0.01) is True  # due now: no waiting at all
    finally:
        real.close()


# -- concurrency (PostgreSQL: SKIP LOCKED) --------------------------------------------------------


@pytest.mark.postgres
def test_concurrent_claimers_never_share_a_job(pg_database: str) -> None:
    engine = make_engine(pg_database, pool_size=10)
    upgrade(engine)
    q = Queue(engine)
    q.enqueue_many("noop", [f"k{i}" for i in range(2000)])
    taken: list[list[int]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def consume(i: int) -> None:
        mine = Queue(engine)
        barrier.wait()
        while batch := mine.claim(37, LEASE):
            taken[i].extend(c.id for c in batch)
            mine.complete_many([(c.id, c.attempt) for c in batch])

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [job_id for ids in taken for job_id in ids]
    assert len(everything) == 2000 and len(set(everything)) == 2000
    assert sum(1 for ids in taken if ids) > 1  # the work really was shared
    assert q.counts()["noop"]["done"] == 2000
    engine.dispose()


# -- the stateful model (real PostgreSQL) ----------------------------------------------------------

KEYS = ("a", "b", "c", "d", "e")
MAX_ATTEMPTS = 3


@dataclass
class Model:
    """What the queue should hold for one key."""

    state: str
    due: dt.datetime | None
    priority: int
    failures: int = 0
    attempts: int = 0
    lease_until: dt.datetime | None = None


@dataclass
class Claim:
    key: str
    job_id: int
    attempt: int


@dataclass
class World:
    jobs: dict[str, Model] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)


class QueueMachine(RuleBasedStateMachine):
    """Random operations on the queue, mirrored on :class:`Model` rows."""

    engine = None  # set by the test (one database per test, emptied per example)

    def __init__(self) -> None:
        super().__init__()
        assert self.engine is not None
        with self.engine.begin() as conn:
            conn.execute(text("TRUNCATE jodl_job, jodl_family RESTART IDENTITY CASCADE"))
        self.clock = Clock(START)
        self.q = Queue(self.engine, clock=self.clock, max_attempts=MAX_ATTEMPTS)
        self.world = World()

    # -- model helpers --

    def _fail_model(self, m: Model, dead: bool, backoff: float) -> None:
        m.failures += 1
        m.lease_until = None
        if dead or m.failures >= MAX_ATTEMPTS:
            m.state = JobState.DEAD
        else:
            m.state = JobState.QUEUED
            if m.due is None:
                m.due = self.clock.now + dt.timedelta(seconds=backoff)

    def _holds(self, c: Claim) -> bool:
        m = self.world.jobs.get(c.key)
        return m is not None and m.state == JobState.CLAIMED and m.attempts == c.attempt

    # -- rules --

    @rule(
        key=st.sampled_from(KEYS),
        delay=st.sampled_from([0, 0, 5, 30]),
        priority=st.integers(0, 3),
    )
    def enqueue(self, key: str, delay: int, priority: int) -> None:
        self.q.enqueue("fam", key, {"k": key}, delay=delay, priority=priority)
        due = self.clock.now + dt.timedelta(seconds=delay)
        m = self.world.jobs.get(key)
        if m is None:
            self.world.jobs[key] = Model(JobState.QUEUED, due, priority)
        elif m.state in (JobState.QUEUED, JobState.CLAIMED):
            m.due = due
            m.priority = max(m.priority, priority)
        else:
            m.state, m.due, m.priority, m.failures = JobState.QUEUED, due, priority, 0

    @rule(limit=st.integers(1, 3))
    def claim(self, limit: int) -> None:
        now = self.clock.now
        due = {
            k: m
            for k, m in self.world.jobs.items()
            if m.state == JobState.QUEUED and m.due is not None and m.due <= now
        }
        got = self.q.claim(limit, LEASE)
        keys = [c.key for c in got]
        assert len(keys) == len(set(keys)) == min(limit, len(due))
        assert set(keys) <= set(due)
        rank = {k: (m.priority, -(m.due - START).total_seconds()) for k, m in due.items()}
        for k in keys:
            for other in set(due) - set(keys):
                assert rank[k] >= rank[other], (k, other, rank)
        for c in got:
            m = self.world.jobs[c.key]
            m.attempts += 1
            assert c.attempt == m.attempts
            assert c.failures == m.failures
            m.state, m.due = JobState.CLAIMED, None
            m.lease_until = now + dt.timedelta(seconds=LEASE)
            self.world.claims.append(Claim(c.key, c.id, c.attempt))

    @precondition(lambda self: self.world.claims)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(self.world.claims))
        held = self._holds(c)
        assert self.q.complete(c.job_id, c.attempt) is held
        if held:
            m = self.world.jobs[c.key]
            m.state = JobState.QUEUED if m.due is not None else JobState.DONE
            m.failures, m.lease_until = 0, None

    @precondition(lambda self: self.world.claims)
    @rule(data=st.data(), retryable=st.booleans())
    def fail(self, data: st.DataObject, retryable: bool) -> None:
        c = data.draw(st.sampled_from(self.world.claims))
        held = self._holds(c)
        outcome = self.q.fail(c.job_id, c.attempt, "boom", retryable=retryable)
        if not held:
            assert outcome is None
            return
        m = self.world.jobs[c.key]
        self._fail_model(m, not retryable, retry_delay(m.failures + 1))
        assert outcome == m.state

    @rule(seconds=st.sampled_from([1, 5, 30, 60, 61]))
    def tick(self, seconds: int) -> None:
        self.clock.advance(seconds)
        expired = [
            m
            for m in self.world.jobs.values()
            if m.state == JobState.CLAIMED and m.lease_until and m.lease_until < self.clock.now
        ]
        assert self.q.release_expired() == len(expired)
        for m in expired:
            self._fail_model(m, False, 0.0)

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        m = self.world.jobs.get(key)
        live = m is not None and m.state != JobState.DELETED
        assert self.q.delete("fam", key) is live
        if m is not None:
            m.state, m.due, m.lease_until = JobState.DELETED, None, None

    @rule()
    def requeue_dead(self) -> None:
        dead = [m for m in self.world.jobs.values() if m.state == JobState.DEAD]
        assert self.q.requeue_dead("fam") == len(dead)
        for m in dead:
            m.state, m.due, m.failures = JobState.QUEUED, self.clock.now, 0

    # -- invariants --

    @invariant()
    def one_row_per_key_and_none_lost(self) -> None:
        with self.engine.connect() as conn:  # type: ignore[union-attr]
            per_key = dict(conn.execute(select(Job.key, func.count()).group_by(Job.key)).all())
            rows = conn.execute(
                select(Job.key, Job.state, Job.priority, Job.failures, Job.attempts, Job.due_at)
            ).all()
        assert all(count == 1 for count in per_key.values())
        assert set(per_key) == set(self.world.jobs)
        for key, state, priority, failures, attempts, due in rows:
            m = self.world.jobs[key]
            assert (state, priority, failures, attempts) == (
                m.state,
                m.priority,
                m.failures,
                m.attempts,
            ), (key, m)
            if state in (JobState.QUEUED, JobState.CLAIMED):
                assert due == m.due, (key, due, m)

    @invariant()
    def counts_agree(self) -> None:
        now = self.clock.now
        want = {"queued": 0, "running": 0, "overdue": 0, "dead": 0, "done": 0}
        for m in self.world.jobs.values():
            if m.state == JobState.QUEUED:
                want["queued"] += 1
                want["overdue"] += int(m.due is not None and m.due <= now)
            elif m.state == JobState.CLAIMED:
                want["running"] += 1
            elif m.state in (JobState.DEAD, JobState.DONE):
                want[m.state] += 1
        got = self.q.counts().get("fam", dict.fromkeys(want, 0))
        assert got == want

    def teardown(self) -> None:
        self.q.close()


@pytest.mark.postgres
def test_a_claim_walks_the_queue_index_in_order_on_a_table_without_statistics(
    pg_database: str,
) -> None:
    """A burst of enqueues into a table never analysed: past the first, a claim is the
    two statements of its transaction (no read of the families of its own, though one
    named has no row) and its plan reads the queue index in order, with no sort of
    every queued job."""
    engine = make_engine(pg_database)
    upgrade(engine)
    q = Queue(engine)
    for start in range(0, 20_000, 5_000):
        q.enqueue_many("noop", [f"k{i}" for i in range(start, start + 5_000)])
    with engine.connect() as conn:
        never = conn.scalar(text("SELECT reltuples < 0 FROM pg_class WHERE relname = 'jodl_job'"))
    q.claim(1, LEASE, families=["noop"])  # the budgets and the names, read once and kept
    statements: list[tuple[str, object]] = []

    def seen(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        claimed = q.claim(500, LEASE, families=["noop", "no-such-family"])
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert [c.key for c in claimed] == [f"k{i}" for i in range(1, 501)]
    assert never  # the plan below is the one a table with no statistics gets
    assert [s for s, _ in statements if "jodl_family" in s and "UPDATE" not in s] == []
    setting, (claim, params) = [(s, p) for s, p in statements if "SELECT 1" not in s]
    assert setting[1] == {"n0": "enable_sort", "v0": "off"}
    nodes = plan_nodes(engine, setting, (claim, params))
    assert not any("Sort" in n["Node Type"] for n in nodes)
    assert any(n.get("Index Name") == "ix_jodl_job_queue" for n in nodes)
    engine.dispose()


def test_queue_matches_its_model_on_postgresql(pg_database: str) -> None:
    engine = make_engine(pg_database)
    upgrade(engine)
    QueueMachine.engine = engine
    try:
        run_state_machine_as_test(
            QueueMachine,
            settings=settings(
                max_examples=60,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        QueueMachine.engine = None
        engine.dispose()
