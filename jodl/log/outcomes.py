"""Writing outcomes: dispatches before they are sent, outcome batches after, claims' ends.

The hot path of the log: a batch of outcomes is one COPY into a staging table and
a few set-based statements, whatever its size, committed in one transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    DateTime,
    Engine,
    Integer,
    String,
    and_,
    bindparam,
    case,
    cast,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from . import bulk
from .learning import learn_from_executions, settle_homes, write_homes
from .lease import check_fence
from .models import Dispatch, Execution, Job, JobState, table_of, utcnow
from .notices import announce, begin
from .records import EXEC_COLUMNS, ClaimDone, ClaimFailed, OutcomeBatch

#: First pause before an on-demand job that failed runs again (seconds); doubles per failure.
RETRY_DELAY = 1.0
#: Longest pause before an on-demand job that failed runs again (seconds).
RETRY_DELAY_MAX = 300.0


def retry_delay(failures: int) -> float:
    """Seconds an on-demand job waits in the queue after its ``failures``-th failure."""
    return min(RETRY_DELAY_MAX, RETRY_DELAY * 2 ** max(0, min(failures - 1, 30)))


def _ints(name: str, values: list[int | None], item: type[BigInteger | Integer]) -> Any:
    return cast(bindparam(name, bulk.int_array(values), type_=String), ARRAY(item))


def close_claims(
    conn: Connection,
    done: Sequence[ClaimDone | tuple[int, int]] = (),
    failed: Sequence[ClaimFailed | tuple[int, int, str, dt.datetime | None]] = (),
) -> int:
    """Attempt-guarded ends of claimed on-demand jobs; returns how many rows changed.

    ``done``: (job_id, attempt[, node_id]). The job is done, or queued again when it
    was enqueued again while it ran (``due_at`` set meanwhile); a job with no home gets
    ``node_id``, the node of its result, in the same statement. ``failed``: (job_id,
    attempt, error, due_at): back in the queue at ``due_at`` (an enqueue made
    while it ran wins), or dead when ``due_at`` is None. Only a job still claimed
    by that very attempt changes, so a late outcome of a superseded attempt (its
    lease ended and another claim took the job) changes nothing. The jobs are
    announced to their waiters (:func:`jodl.log.notices.announce`).
    """
    announce(conn, [c[0] for c in done] + [c[0] for c in failed])
    now = utcnow()
    changed = 0
    guard = (
        Job.id == bindparam("jid"),
        Job.state == JobState.CLAIMED,
        Job.attempts == bindparam("att"),
    )
    if done:
        ends = [ClaimDone(*c) for c in done]

        def finish(node: Any) -> dict[str, Any]:
            homeless = and_(Job.permanent_node_id.is_(None), Job.trial_node_id.is_(None))
            return {
                "state": case((Job.due_at.is_(None), JobState.DONE), else_=JobState.QUEUED),
                "failures": 0,
                "lease_until": None,
                "last_done_at": now,
                "updated_at": now,
                "permanent_node_id": case((homeless, node), else_=Job.permanent_node_id),
            }

        if conn.dialect.name == "postgresql":
            # The batch as arrays: one statement and one plan for thousands of jobs.
            # Each array as its text (bulk.int_array): a list went element by element.
            claims = (
                func.unnest(
                    _ints("jids", [c.job_id for c in ends], BigInteger),
                    _ints("atts", [c.attempt for c in ends], Integer),
                    _ints("nodes", [c.node_id for c in ends], Integer),
                )
                .table_valued("jid", "att", "node")
                .render_derived()
            )
            changed += conn.execute(
                update(Job)
                .where(
                    Job.id == claims.c.jid,
                    Job.state == JobState.CLAIMED,
                    Job.attempts == claims.c.att,
                )
                .values(**finish(claims.c.node))
            ).rowcount
        else:
            changed += conn.execute(
                update(Job).where(*guard).values(**finish(bindparam("node", type_=Integer()))),
                [{"jid": c.job_id, "att": c.attempt, "node": c.node_id} for c in ends],
            ).rowcount
    if failed:
        changed += conn.execute(
            update(Job)
            .where(*guard)
            .values(
                state=bindparam("st"),
                due_at=func.coalesce(Job.due_at, bindparam("due", type_=DateTime())),
                failures=Job.failures + 1,
                lease_until=None,
                last_error=bindparam("err"),
                updated_at=now,
            ),
            [
                {
                    "jid": j,
                    "att": a,
                    "err": e,
                    "due": due,
                    "st": JobState.DEAD if due is None else JobState.QUEUED,
                }
                for j, a, e, due in failed
            ],
        ).rowcount
    return changed


class OutcomeLog:
    """The write-ahead dispatch log and the outcome batches (one transaction each)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def record_dispatches(self, rows: list[dict[str, Any]]) -> None:
        """Log batches about to be sent (write-ahead): id, run_id, node_id, epoch, items."""
        if not rows:
            return
        now = utcnow()
        for row in rows:
            row.setdefault("sent_at", now)
            row.setdefault("is_open", True)
        with self.engine.begin() as conn:
            if rows[0].get("epoch"):
                check_fence(conn, rows[0]["epoch"])
            bulk.insert_rows(conn, table_of(Dispatch), rows)

    def record(self, *batches: OutcomeBatch) -> None:
        """Commit batches of outcomes, and what they teach, in one transaction, each
        as :meth:`_record` writes it.
        """
        batches = tuple(batch for batch in batches if batch)
        if not batches:
            return
        with begin(self.engine) as conn:
            for epoch in sorted({batch.epoch for batch in batches if batch.epoch}):
                check_fence(conn, epoch)
            for batch in batches:
                self._record(conn, batch, last=batch is batches[-1])

    def _record(self, conn: Connection, batch: OutcomeBatch, last: bool = False) -> None:
        """Write a batch of outcomes, and what they teach.

        Executions are appended to the log and folded into JobOnNode
        (:func:`learn_from_executions`); with ``settle``, jobs with no home get the
        node of their result (:func:`settle_homes`). Dead jobs are marked, claims
        closed (:func:`close_claims`: the attempt guards them, so a superseded
        attempt changes nothing), homes written and dispatches closed. An execution
        id has one outcome row at most (primary key), and a job one ``done`` row per
        run (unique index): the database refuses a second.
        """
        if batch.executions:
            self._append(conn, batch.executions, batch.settle, last)
        if batch.homes:
            write_homes(conn, batch.homes)
        if batch.dead:
            conn.execute(
                update(Job)
                .where(Job.id == bindparam("jid"))
                .values(
                    state=JobState.DEAD,
                    last_error=bindparam("err"),
                    run_id=bindparam("rid"),
                    updated_at=utcnow(),
                ),
                [{"jid": j, "err": e, "rid": r} for j, e, r in batch.dead],
            )
        if batch.claims_done or batch.claims_failed:
            close_claims(conn, batch.claims_done, batch.claims_failed)
        if batch.closed:
            conn.execute(
                update(Dispatch).where(Dispatch.id.in_(list(batch.closed))).values(is_open=False)
            )

    @staticmethod
    def _append(conn: Connection, executions: Sequence[Any], settle: bool, last: bool) -> None:
        # One COPY into a staging table feeds the log, the learning and the homes;
        # ``last``: the transaction's last batch (its commit empties the table).
        table = table_of(Execution)
        with bulk.staged(conn, table, EXEC_COLUMNS, executions, last=last) as staged:
            conn.execute(
                bulk.prepared(
                    conn,
                    f"append:{staged.name}",
                    lambda: insert(Execution).from_select(
                        EXEC_COLUMNS, select(*(staged.c[c] for c in EXEC_COLUMNS))
                    ),
                )
            )
            learn_from_executions(conn, staged, utcnow())
            if settle:
                settle_homes(conn, staged)

    def settled(self, exec_ids: Sequence[int]) -> set[int]:
        """Which of ``exec_ids`` have an outcome in the log (done, or given up on)."""
        out: set[int] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(exec_ids), 5000):
                chunk = list(exec_ids[start : start + 5000])
                out.update(conn.scalars(select(Execution.id).where(Execution.id.in_(chunk))))
        return out
