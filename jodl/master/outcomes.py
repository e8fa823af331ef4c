"""Results and failures: collected from the agents, committed, then acknowledged.

One call per agent per loop step asks for results and failures (protocol c, d).
Each outcome changes its job in the job book (``finish``, ``fail``) and becomes an
execution row; the rows of one agent are committed in one transaction by the log
writer, and acknowledged to the agent on its next call, once committed, so a crash
loses nothing. Jobs of a cycle count into their run's progress; an on-demand job's
outcome closes (or re-queues) its claim.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..agent.client import AgentLink
from ..agent.replies import DoneRow, FailedRow, Refused
from ..exceptions import AgentUnavailable, Fenced
from ..log.models import ExecState, utcnow
from ..log.outcomes import retry_delay
from ..log.records import ClaimDone, ClaimFailed, DeadJob, ExecutionRow, PendingJob
from ..obs.metrics import count_outcomes
from .book import Closed, Failed, Failure, Finished
from .bytes_budget import RunBytes, record_deferred
from .calls import Outcome
from .nodes import Nodes, NodeSlot
from .parts import PartOf, Parts
from .records import execution_row

log = logging.getLogger("jodl.master")

#: Results fetched from one agent per call at most.
COLLECT_LIMIT = 10_000


@dataclass
class _Batch:
    """What one agent's report makes: rows to commit, and what changed for runs."""

    rows: list[ExecutionRow] = field(default_factory=list)
    acks: list[int] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    dead: list[DeadJob] = field(default_factory=list)
    claims: list[ClaimDone | ClaimFailed] = field(default_factory=list)
    #: Jobs done, then jobs out of the book by failure (dead, or on-demand).
    finished: list[PendingJob] = field(default_factory=list)
    n_done: int = 0
    retry: list[int] = field(default_factory=list)
    #: A job of a run with no home yet: the log gives it one with its result.
    settle: bool = False
    #: Runs whose bytes budget these results passed.
    over: list[int] = field(default_factory=list)


def _ask(
    link: AgentLink, epoch: int, acks: list[int], failures: bool
) -> tuple[list[DoneRow], list[FailedRow]]:
    """Results, and failures if any may be there, of one agent (in a call thread): one
    round trip either way.

    Decoded and checked by the link (a bad reply: AgentUnavailable).
    """
    if failures:
        return link.outcomes(epoch, acks, COLLECT_LIMIT)
    return link.done(epoch, acks, COLLECT_LIMIT), []


class Outcomes(PartOf):
    """Collects, commits and acknowledges outcomes; keeps runs' counts."""

    def __init__(self, parts: Parts, nodes: Nodes) -> None:
        super().__init__(parts)
        self.store = parts.store
        self.book = parts.book
        self.nodes = nodes
        self.ledger = parts.ledger
        self.families = parts.families
        self.knowledge = parts.knowledge
        self.runs = parts.runs
        #: Runs of families with a bytes budget: what their results fetched so far.
        self.run_bytes: dict[int, RunBytes] = {}
        #: node -> execution ids to cancel on its agent (copies that lost the race).
        self.to_cancel: dict[int, list[int]] = {}

    def collect(self) -> int:
        """Collect done and failed jobs from every agent (c, d); commit; ack next time."""
        calls = {node_id: self.ask(node_id, *ask) for node_id, ask in self.asks().items()}
        return self.take(self.nodes.calls.each(calls))

    def ask(
        self, node_id: int, acks: list[int], failures: bool
    ) -> Callable[[], tuple[list[DoneRow], list[FailedRow]]]:
        """The call that collects from ``node_id`` (see :meth:`asks`)."""
        return partial(_ask, self.nodes[node_id].link, self.epoch, acks, failures)

    def asks(self) -> dict[int, tuple[list[int], bool]]:
        """The agents to collect from: node -> (the acknowledgements it is owed, taken
        now; whether failures may be there, i.e. it has jobs in flight)."""
        return {
            slot.id: (slot.take_acks(), bool(self.book.flights[slot.id]))
            for slot in self.nodes
            if slot.usable and (self.book.flights[slot.id] or slot.acks)
        }

    def take(self, replies: Mapping[int, Outcome[tuple[Any, Any]]]) -> int:
        """Report the agents' replies to :meth:`asks` (every agent asked at once, in the
        pool's threads); the book changes here only."""
        got = 0
        for node_id, reply in replies.items():
            slot = self.nodes[node_id]
            try:
                done, failed = reply.get()
            except Fenced:
                raise  # a newer master took over: stop
            except AgentUnavailable:
                self.nodes.down(slot, self.epoch)  # suspect: its jobs stay for now
                continue
            got += self.report(slot, done, failed)
        return got

    def refused(self, slot: NodeSlot, refused: tuple[Refused, ...]) -> None:
        """Jobs the agent would not take (e.g. unknown family there): permanent failures."""
        for exec_id, error in refused:
            log.warning("node %s refused execution %s: %s", slot.link.address, exec_id, error)
        now = time.time()
        failed = [FailedRow(r.exec_id, 0.0, now, r.reason, r.known_id) for r in refused]
        self.report(slot, (), failed)

    def report(self, slot: NodeSlot, done: Any, failed: Any) -> int:
        """Commit what ``slot`` reported; update knowledge, runs and the book."""
        seen = slot.reported
        if seen:  # reported before, their commit under way: not again
            done = [row for row in done if row[0] not in seen]
            failed = [row for row in failed if row[0] not in seen]
        if not done and not failed:
            return 0
        batch = _Batch()
        if done:
            self._done(slot, batch, done)
        batch.n_done = len(batch.finished)
        for exec_id, duration, finished_at, error, retryable in failed:
            self._failed(slot, batch, exec_id, duration, finished_at, error, retryable)
        slot.observe(batch.durations)
        count_outcomes(
            batch.finished, batch.n_done, batch.dead, batch.retry, batch.claims, self.book.jobs
        )
        acks = batch.acks
        seen.update(acks)
        # Acknowledged to the agent on a later call, once the writer has committed.
        self.ledger.commit(
            batch.rows, batch.dead, batch.claims, after=lambda: slot.add_acks(acks),
            settle=batch.settle,
        )  # fmt: skip
        self._progress(batch)
        return len(batch.rows)

    # -- one outcome ---------------------------------------------------------------------

    def _done(self, slot: NodeSlot, batch: _Batch, done: Any) -> None:
        """``slot``'s results into ``batch`` and the book; knowledge and the watcher told.

        One pass over the rows with what they share looked up once (the node, the
        epoch, the parts called), the watcher told once: taking the results of a cycle
        of no-op jobs cost the loop 11.8-12.2 µs of CPU a result one call at a time,
        8.6 so (bench/throughput.py's cycle, timed inside)."""
        node_id, epoch, book = slot.id, self.epoch, self.book
        finish, record = book.finish, self.knowledge.record
        acks, rows, finished, claims = batch.acks, batch.rows, batch.finished, batch.claims
        spent = self.run_bytes
        watched: list[tuple[PendingJob, float, tuple[int, float] | None]] = []
        for exec_id, duration, at, result in done:
            acks.append(exec_id)
            got = finish(node_id, exec_id)
            if type(got) is not Finished:
                # Committed before a restart, superseded, or given up on (lost): only
                # acknowledged, and said, since the job may have run twice.
                log.info("node %s: result of execution %s not awaited", slot.link.address, exec_id)
                continue
            closed, job, placed, superseded = got
            rows.append(
                execution_row(
                    exec_id, closed.sent, ExecState.DONE, epoch, backup=closed.backup,
                    result=result, duration=duration, finished=at,
                )
            )  # fmt: skip
            finished.append(job)
            if job.claim is not None:  # its claim's close gives it its home, if it has none
                claims.append(ClaimDone(job.id, job.claim, node_id))
            elif job.permanent_node_id is None and job.trial_node_id is None:
                batch.settle = True
            record(job.id, node_id, job.family, duration)
            watched.append((job, duration, placed))
            if superseded:
                self._superseded(batch, node_id, superseded)
            if spent and job.run_id in spent and spent[job.run_id].add(result):
                batch.over.append(job.run_id)
        batch.durations.extend(duration for _job, duration, _placed in watched)
        if self.parts.watcher is not None and watched:
            self.parts.watcher.results(slot, watched)

    def _superseded(self, batch: _Batch, node_id: int, superseded: list[Closed]) -> None:
        """Other copies of a job done on ``node_id``: cancelled rows, and cancels to send."""
        for other in superseded:
            batch.rows.append(
                self._row(
                    other,
                    ExecState.CANCELLED,
                    error=(
                        f"superseded: the copy on node {node_id} finished first; this copy "
                        "may have started (its result, if any, is discarded)"
                    ),
                )
            )
            self.to_cancel.setdefault(other.sent.node_id, []).append(other.exec_id)

    def _failed(
        self,
        slot: NodeSlot,
        batch: _Batch,
        exec_id: int,
        duration: float,
        at: float,
        error: str,
        retryable: bool,
    ) -> None:
        batch.acks.append(exec_id)
        sent = self.book.flights[slot.id].get(exec_id)
        if sent is None or sent.job_id not in self.book.jobs:
            self.book.finish(slot.id, exec_id)  # not awaited: closed, only acknowledged
            return
        family = self.book.jobs[sent.job_id].family
        got = self.book.fail(
            slot.id,
            exec_id,
            retryable,
            self.families.max_attempts.get(family, 1),
            self.families.tuned(family).attempts_before_move,
        )
        assert isinstance(got, Failed)
        closed, job, then = got
        batch.rows.append(
            self._row(closed, ExecState.FAILED, error=error, duration=duration, finished=at)
        )
        if then is Failure.COPY_RUNS:
            return  # another copy of the job still runs: let it finish
        self.knowledge.record(job.id, slot.id, job.family, None)
        if then is Failure.ON_DEMAND:
            # Back to the queue after a backoff (or dead there), guarded by the claimed
            # attempt; the failure count lives on disk, not in this master.
            out = not retryable or job.attempts >= self.families.max_attempts.get(job.family, 1)
            due = None if out else utcnow() + dt.timedelta(seconds=retry_delay(job.attempts))
            assert job.claim is not None  # Failure.ON_DEMAND: a claimed job
            batch.claims.append(ClaimFailed(job.id, job.claim, error, due))
            batch.finished.append(job)
            return
        active = self.runs.get(job.run_id) if job.run_id is not None else None
        if active is not None:
            active.failed += 1
        if then is Failure.DEAD:
            batch.dead.append(DeadJob(job.id, error, job.run_id))
            batch.finished.append(job)
            if active is not None:
                active.dead += 1
        else:
            batch.retry.append(job.id)

    def _row(self, closed: Closed, state: str, **outcome: Any) -> ExecutionRow:
        return execution_row(
            closed.exec_id, closed.sent, state, self.epoch, backup=closed.backup, **outcome
        )

    # -- runs' progress --------------------------------------------------------------------

    def _progress(self, batch: _Batch) -> None:
        """Count finished jobs into their runs; hold back runs past their bytes budget."""
        now = time.perf_counter()
        touched: set[int] = set()
        for i, job in enumerate(batch.finished):
            run_id = job.run_id
            if run_id is None or (active := self.runs.get(run_id)) is None:
                continue  # on demand
            active.remaining -= 1
            if i < batch.n_done:  # the others are dead (a failed cycle job in ``finished``)
                active.done += 1
            active.last_result = now
            touched.add(run_id)  # the job's, not its run's mapped attribute
        for run_id in batch.over:
            self.hold_back(run_id)
        progress = self.parts.progress
        if progress is not None:
            for run_id in touched:
                active = self.runs[run_id]
                progress(active.done + active.dead, active.total)

    def cancel(self, job_ids: list[int], reason: str = "job deleted") -> int:
        """Stop dispatching these jobs: drop them unsent, cancel them on agents if sent.

        For jobs deleted (or claimed by another attempt) while this master holds
        them; a result they still report is only acknowledged. Returns how many
        of them this master held.
        """
        held = [j for j in job_ids if j in self.book.jobs]
        if not held:
            return 0
        runs = [self.book.jobs[j].run_id for j in held]
        rows: list[ExecutionRow] = []
        for node_id, closed in self.book.cancel(held).items():
            rows.extend(self._row(c, ExecState.CANCELLED, error=reason) for c in closed)
            slot = self.nodes[node_id]
            if slot.usable:
                self.nodes.cancel(slot, self.epoch, [c.exec_id for c in closed])
        for run_id in runs:
            active = self.runs.get(run_id) if run_id is not None else None
            if active is not None:
                active.remaining -= 1
        self.ledger.commit(rows)
        return len(held)

    def hold_back(self, run_id: int) -> int:
        """A run's bytes budget is spent: its jobs not sent yet are not sent in this run.

        They stay due (idle, no result in this run), so the next run has them; the
        run records how many. Jobs in flight finish. Returns how many were held back.
        """
        active = self.runs.get(run_id)
        if active is None:
            return 0
        ids = self.book.hold_back(run_id)
        if not ids:
            return 0
        active.remaining -= len(ids)
        active.total -= len(ids)
        record_deferred(self.store.fenced_engine, run_id, active.family.name, len(ids))
        log.info(
            "run %s#%d: bytes budget spent, %d jobs wait for the next run",
            active.family.name,
            active.run.number,
            len(ids),
            extra={"run_id": run_id, "family": active.family.name},
        )
        return len(ids)

    def flush_cancels(self) -> None:
        """Cancel on their agents the copies that lost the race."""
        cancels, self.to_cancel = self.to_cancel, {}
        for node_id, exec_ids in cancels.items():
            slot = self.nodes.get(node_id)
            if slot is not None and slot.usable:
                self.nodes.cancel(slot, self.epoch, exec_ids)
