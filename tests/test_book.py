"""The job book: each transition, its invariants under random transitions (hypothesis),
and at every step of real cycles on in-process agents."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from jodl.agent.local import start_agent
from jodl.log.records import NO_NODES, PendingJob, Sent
from jodl.log.store import Store
from jodl.master import Master
from jodl.master.book import Closed, Failed, Failure, Finished, JobBook, Stage
from jodl.master.invariants import check_book
from jodl.placement import NodeLoad
from jodl.settings.config import Settings

SENT_AT = dt.datetime(2026, 1, 1)


def pending(job_id: int, run_id: int | None = 1, claim: int | None = None) -> PendingJob:
    return PendingJob(
        job_id, f"job-{job_id}", "fam", "{}", 0, run_id, None, None, 0, NO_NODES, claim
    )  # fmt: skip


def book_with(nodes: int = 2, jobs: int = 3, **kw: object) -> JobBook:
    book = JobBook()
    for n in range(1, nodes + 1):
        book.add_node(NodeLoad(n, f"127.0.0.1:{9000 + n}", 2))
    for j in range(1, jobs + 1):
        book.hold(pending(j, **kw))  # type: ignore[arg-type]
    return book


class Sender:
    """Execution ids as the store would hand them out; one dispatch per send."""

    def __init__(self) -> None:
        self.next_id = 100

    def send(self, book: JobBook, node_id: int, job_ids: list[int]) -> list[int]:
        sents = []
        dispatch = self.next_id
        for job_id in job_ids:
            attempt = book.jobs[job_id].attempts + 1
            sents.append(Sent(self.next_id, job_id, node_id, attempt, dispatch, SENT_AT, 1))
            self.next_id += 1
        book.send(node_id, sents)
        return [s.exec_id for s in sents]

    def backup(self, book: JobBook, node_id: int, job_id: int) -> int:
        (straggler, on), *_ = (
            (e, n) for n, f in book.flights.items() for e, s in f.items() if s.job_id == job_id
        )
        sent = Sent(self.next_id, job_id, node_id, 1, self.next_id, SENT_AT, 1)
        self.next_id += 1
        book.add_backup(sent, straggler, on)
        return sent.exec_id


def test_a_held_job_waits_then_is_placed_then_sent() -> None:
    book = book_with(jobs=2)
    assert [j.id for j in book.waiting_jobs()] == [1, 2]
    book.place(1, 1, 0.5)
    assert book.stage[1] is Stage.QUEUED and book.placed[1] == (1, 0.5)
    assert book.loads[1].queued_jobs == 1 and book.loads[1].queued_work == 0.5
    assert [j.id for j in book.waiting_jobs()] == [2] and book.has_waiting()
    assert book.pick(1, 5) == [1]
    (exec_id,) = Sender().send(book, 1, [1])
    assert book.stage[1] is Stage.IN_FLIGHT and book.flights[1][exec_id].job_id == 1
    assert book.dispatch_left == {exec_id: 1}
    check_book(book)


def test_finish_takes_the_job_out_and_closes_its_dispatch() -> None:
    book = book_with(jobs=2)
    book.place(1, 1, 1.0)
    book.place(2, 1, 1.0)
    e1, e2 = Sender().send(book, 1, book.pick(1, 2))
    got = book.finish(1, e1)
    assert isinstance(got, Finished) and got.job.id == 1 and got.placed == (1, 1.0)
    assert 1 not in book.jobs and book.loads[1].queued_jobs == 1
    assert book.take_closed_dispatches() == []  # one execution of the dispatch still open
    assert book.finish(1, e1) is None  # twice: not in flight any more
    book.finish(1, e2)
    assert book.take_closed_dispatches() == [e1]
    check_book(book)


def test_fail_retries_on_the_same_node_then_elsewhere_then_dies() -> None:
    book, sender = book_with(jobs=1), Sender()
    book.place(1, 1, 1.0)
    (e,) = sender.send(book, 1, book.pick(1, 1))
    got = book.fail(1, e, retryable=True, max_attempts=3, moves_after=2)
    assert isinstance(got, Failed) and got.then is Failure.RETRY
    assert book.stage[1] is Stage.WAITING and book.retry_on == {1: 1}
    check_book(book)
    assert book.take_retry_node(1) == 1 and book.take_retry_node(1) is None  # taken once
    book.place(1, 1, 1.0)
    (e,) = sender.send(book, 1, book.pick(1, 1))
    got = book.fail(1, e, retryable=True, max_attempts=3, moves_after=2)
    assert isinstance(got, Failed) and got.then is Failure.RETRY
    assert book.jobs[1].failed_on == {1} and 1 not in book.retry_on  # avoid node 1 now
    book.place(1, 2, 1.0)
    (e,) = sender.send(book, 2, book.pick(2, 1))
    got = book.fail(2, e, retryable=True, max_attempts=3, moves_after=2)
    assert isinstance(got, Failed) and got.then is Failure.DEAD and not book.jobs
    check_book(book)


def test_a_permanent_failure_and_an_on_demand_failure_leave_the_book() -> None:
    book, sender = book_with(jobs=1), Sender()
    book.place(1, 1, 1.0)
    (e,) = sender.send(book, 1, book.pick(1, 1))
    got = book.fail(1, e, retryable=False, max_attempts=9, moves_after=1)
    assert isinstance(got, Failed) and got.then is Failure.DEAD
    book.hold(pending(2, run_id=None, claim=1))
    book.place(2, 1, 1.0)
    (e,) = sender.send(book, 1, book.pick(1, 1))
    got = book.fail(1, e, retryable=True, max_attempts=9, moves_after=1)
    assert isinstance(got, Failed) and got.then is Failure.ON_DEMAND and not book.jobs
    assert got.job.attempts == 1
    check_book(book)


def test_lose_gives_every_job_of_the_node_back() -> None:
    book, sender = book_with(jobs=3), Sender()
    for j in (1, 2, 3):
        book.place(j, 1, 1.0)
    sender.send(book, 1, book.pick(1, 2))
    closed = book.lose(1)
    assert sorted(c.sent.job_id for c in closed) == [1, 2]
    assert all(book.stage[j] is Stage.WAITING for j in (1, 2, 3))
    assert book.loads[1].queued_jobs == 0 and book.loads[1].queued_work == 0.0
    assert not book.dispatch_left and len(book.take_closed_dispatches()) == 1
    check_book(book)


def test_a_backup_copy_keeps_its_job_in_flight_when_the_other_copy_goes() -> None:
    book, sender = book_with(jobs=1), Sender()
    book.place(1, 1, 1.0)
    (e,) = sender.send(book, 1, book.pick(1, 1))
    b = sender.backup(book, 2, 1)
    assert book.copies[1] == {e: 1, b: 2} and book.backups == {b}
    check_book(book)
    assert book.lose(1)[0].exec_id == e
    assert book.stage[1] is Stage.IN_FLIGHT and 1 not in book.copies
    got = book.finish(2, b)
    assert isinstance(got, Finished) and got.closed.backup and not book.jobs
    check_book(book)


def test_the_first_result_of_two_copies_supersedes_the_other() -> None:
    book, sender = book_with(jobs=1), Sender()
    book.place(1, 1, 1.0)
    (e,) = sender.send(book, 1, book.pick(1, 1))
    b = sender.backup(book, 2, 1)
    got = book.finish(2, b)
    assert isinstance(got, Finished)
    assert [c.exec_id for c in got.superseded] == [e] and not book.flights[1]
    assert not book.backups and not book.dispatch_left
    check_book(book)


def test_a_failed_copy_lets_the_other_run_on() -> None:
    book, sender = book_with(jobs=1), Sender()
    book.place(1, 1, 1.0)
    (e,) = sender.send(book, 1, book.pick(1, 1))
    sender.backup(book, 2, 1)
    got = book.fail(1, e, retryable=True, max_attempts=1, moves_after=1)
    assert isinstance(got, Failed) and got.then is Failure.COPY_RUNS
    assert book.stage[1] is Stage.IN_FLIGHT and book.jobs[1].attempts == 0
    check_book(book)


def test_take_back_and_moves() -> None:
    book, sender = book_with(jobs=4), Sender()
    for j in (1, 2, 3, 4):
        book.place(j, 1, 1.0)
    (e,) = sender.send(book, 1, book.pick(1, 1))
    assert isinstance(book.take_back(1, e), Closed) and book.stage[1] is Stage.WAITING
    assert book.move_tail(1, {4: (2, 2.0), 3: (2, 2.0)}) == [4, 3]
    assert list(book.queues[2]) == [3, 4] and list(book.queues[1]) == [2]
    assert book.loads[2].queued_work == 4.0 and book.loads[1].queued_jobs == 1
    assert book.move(2, 2, 1.0) and list(book.queues[2]) == [2, 3, 4]
    assert not book.move(2, 2, 1.0)  # already there
    assert book.give_back(2) == [2, 3, 4] and book.loads[2].queued_jobs == 0
    check_book(book)


def test_cancel_and_hold_back_take_jobs_out_from_any_stage() -> None:
    book, sender = book_with(jobs=4), Sender()
    book.place(1, 1, 1.0)
    book.place(2, 1, 1.0)
    sender.send(book, 1, book.pick(1, 1))
    closed = book.cancel([1, 2, 3, 99])
    assert [c.sent.job_id for c in closed[1]] == [1]
    assert list(book.jobs) == [4] and not book.queues[1] and book.loads[1].queued_jobs == 0
    check_book(book)
    book.hold(pending(5, run_id=2))
    book.place(4, 2, 1.0)
    assert book.hold_back(1) == [4] and list(book.jobs) == [5]
    check_book(book)


def test_a_cap_holds_back_jobs_of_a_family_at_its_limit_on_the_node() -> None:
    book, sender = book_with(jobs=3), Sender()
    for j in (1, 2, 3):
        book.place(j, 1, 1.0)
    sender.send(book, 1, book.pick(1, 5, {"fam": 1}))
    assert book.pick(1, 5, {"fam": 1}) == []  # one in flight: the cap is reached
    assert list(book.queues[1]) == [2, 3]
    check_book(book)


def test_check_finds_a_broken_invariant() -> None:
    book = book_with(jobs=1)
    book.place(1, 1, 1.0)
    book.queues[1].clear()  # by hand, not through a transition
    with pytest.raises(AssertionError, match="3"):
        check_book(book)


class BookMachine(RuleBasedStateMachine):
    """Random transitions on a book of three nodes; the invariants hold after each."""

    def __init__(self) -> None:
        super().__init__()
        self.book = JobBook()
        for n in (1, 2, 3):
            self.book.add_node(NodeLoad(n, f"n{n}", 2))
        self.sender = Sender()
        self.next_job = 1

    def _in(self, stage: Stage) -> list[int]:
        return sorted(j for j, s in self.book.stage.items() if s is stage)

    def _flying(self) -> list[tuple[int, int]]:
        return sorted((n, e) for n, f in self.book.flights.items() for e in f)

    @rule(on_demand=st.booleans())
    def hold(self, on_demand: bool) -> None:
        claim = 1 if on_demand else None
        self.book.hold(pending(self.next_job, None if on_demand else 1, claim))
        self.next_job += 1

    @precondition(lambda self: self.book.has_waiting())
    @rule(data=st.data(), node=st.sampled_from([1, 2, 3]), front=st.booleans())
    def place(self, data: st.DataObject, node: int, front: bool) -> None:
        waiting = [j.id for j in self.book.waiting_jobs()]
        job_id = data.draw(st.sampled_from(waiting))
        self.book.place(job_id, node, 0.5, front=front)

    @rule(node=st.sampled_from([1, 2, 3]), take=st.integers(1, 4), cap=st.booleans())
    def send(self, node: int, take: int, cap: bool) -> None:
        picked = self.book.pick(node, take, {"fam": 2} if cap else None)
        if picked:
            self.sender.send(self.book, node, picked)

    @precondition(lambda self: any(self.book.flights.values()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        node, exec_id = data.draw(st.sampled_from(self._flying()))
        assert self.book.finish(node, exec_id) is not None

    @precondition(lambda self: any(self.book.flights.values()))
    @rule(data=st.data(), retryable=st.booleans(), moves_after=st.integers(1, 3))
    def fail(self, data: st.DataObject, retryable: bool, moves_after: int) -> None:
        node, exec_id = data.draw(st.sampled_from(self._flying()))
        self.book.fail(node, exec_id, retryable, 3, moves_after)

    @rule(node=st.sampled_from([1, 2, 3]))
    def lose(self, node: int) -> None:
        self.book.lose(node)

    @precondition(lambda self: any(self.book.flights.values()))
    @rule(data=st.data())
    def take_back(self, data: st.DataObject) -> None:
        node, exec_id = data.draw(st.sampled_from(self._flying()))
        self.book.take_back(node, exec_id)

    @precondition(lambda self: bool(self._in(Stage.IN_FLIGHT)))
    @rule(data=st.data(), node=st.sampled_from([1, 2, 3]))
    def backup(self, data: st.DataObject, node: int) -> None:
        job_id = data.draw(st.sampled_from(self._in(Stage.IN_FLIGHT)))
        if job_id not in self.book.copies:
            self.sender.backup(self.book, node, job_id)

    @precondition(lambda self: bool(self._in(Stage.QUEUED)))
    @rule(data=st.data(), node=st.sampled_from([1, 2, 3]))
    def move(self, data: st.DataObject, node: int) -> None:
        job_id = data.draw(st.sampled_from(self._in(Stage.QUEUED)))
        self.book.move(job_id, node, 1.5)

    @rule(source=st.sampled_from([1, 2, 3]), thief=st.sampled_from([1, 2, 3]))
    def steal_tail(self, source: int, thief: int) -> None:
        tail = list(self.book.queues[source])[-2:]
        if source != thief:
            self.book.move_tail(source, {j: (thief, 0.25) for j in tail})

    @rule(node=st.sampled_from([1, 2, 3]))
    def give_back(self, node: int) -> None:
        self.book.give_back(node)

    @precondition(lambda self: bool(self.book.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.book.jobs)), max_size=3))
        self.book.cancel(ids)

    @rule()
    def hold_back(self) -> None:
        self.book.hold_back(1)

    @invariant()
    def invariants_hold(self) -> None:
        check_book(self.book)


TestBookMachine = BookMachine.TestCase
TestBookMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class CheckedMaster(Master):
    """A master that asserts the job book's invariants after every step of its loop."""

    steps = 0

    def step(self) -> bool:
        got = super().step()
        check_book(self.book)
        self.steps += 1
        return got


def test_the_invariants_hold_at_every_step_of_real_cycles(store: Store, settings: Settings) -> None:
    """In-process agents (no rpyc): failures and retries, then uneven jobs to steal."""
    local = settings.replace(secret=None)
    agents = [start_agent(local.replace(agent_slots=2), f"local:{i}") for i in (1, 2)]
    try:
        for i in (1, 2):
            store.add_node(f"local:{i}", slots=2)
        flaky = store.ensure_family("flaky", max_attempts=3)
        store.add_jobs(
            flaky, [(f"f{i}", json.dumps({"key": f"f{i}", "times": 1})) for i in range(20)]
        )
        sleep = store.ensure_family("sleep")
        seconds = [0.05] * 30 + [0.0] * 30
        store.add_jobs(
            sleep, [(f"s{i}", json.dumps({"seconds": s})) for i, s in enumerate(seconds)]
        )
        master = CheckedMaster(local, store=store)
        try:
            first = master.run_cycle("flaky")
            second = master.run_cycle("sleep")
        finally:
            master.close()
    finally:
        for agent in agents:
            agent.close()
    # Each job fails once on each agent it meets (moving on after one failure), then runs.
    assert (first.done, first.dead) == (20, 0) and 20 <= first.failed <= 40
    assert (second.done, second.dead) == (60, 0)
    assert master.steps > 2 and not master.book.jobs and not master.book.dispatch_left
