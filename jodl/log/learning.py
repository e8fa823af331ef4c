"""What the reconstruction log keeps of placement: learned durations, homes, trial moves.

:class:`Learning` is the gateway (composed into :class:`~jodl.log.store.Store`)
that reads and writes what placement learns: JobOnNode statistics (folded in from each batch of
outcomes inside the database, see :func:`learn_from_executions`), jobs' permanent and
trial nodes, each node's expected work per cycle and the family's cycle period.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    DateTime,
    Engine,
    Table,
    and_,
    case,
    func,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..placement import RECENT_WEIGHT, Knowledge, Learned
from . import bulk, plans
from .models import ExecState, FamilyRow, Job, JobOnNode, JobState, Node, Run, table_of
from .records import Home


class Learning:
    """Reads and writes of what placement learns."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- learning ----------------------------------------------------------------------------

    def load_knowledge(self, knowledge: Knowledge) -> None:
        """Fill ``knowledge`` with every JobOnNode row and nodes' learned speeds."""
        with self.engine.connect() as conn:
            speeds = conn.execute(select(Node.id, Node.speed))
            knowledge.set_speeds({node_id: speed or 1.0 for node_id, speed in speeds})
            # streamed in chunks: a million learned rows never sit in memory as rows
            rows = conn.execution_options(yield_per=20_000).execute(
                select(
                    JobOnNode.job_id,
                    JobOnNode.node_id,
                    JobOnNode.executions,
                    JobOnNode.failures,
                    JobOnNode.mean_duration,
                    JobOnNode.recent_duration,
                    JobOnNode.m2,
                    JobOnNode.last_duration,
                    FamilyRow.name,
                )
                .join(Job, Job.id == JobOnNode.job_id)
                .join(FamilyRow, FamilyRow.id == Job.family_id)
            )
            for job_id, node_id, count, failures, mean, recent, m2, last, fam in rows:
                knowledge.load(
                    job_id, node_id, Learned(count, failures, mean, recent, m2 or 0.0, last), fam
                )

    # -- placement: homes, trial moves, cycle period ---------------------------------------

    def set_homes(self, rows: Sequence[Home | tuple[int, int | None, int | None]]) -> None:
        """Persist (job_id, permanent node, trial node) of jobs whose home changed."""
        if rows:
            with self.engine.begin() as conn:
                write_homes(conn, rows)

    def node_gone_for_good(self, node_id: int) -> None:
        """A removed node: trial moves away from it become permanent, its other homes free."""
        with self.engine.begin() as conn:
            conn.execute(
                update(Job)
                .where(Job.permanent_node_id == node_id, Job.trial_node_id.is_not(None))
                .values(permanent_node_id=Job.trial_node_id, trial_node_id=None)
            )
            conn.execute(
                update(Job).where(Job.permanent_node_id == node_id).values(permanent_node_id=None)
            )
            conn.execute(update(Job).where(Job.trial_node_id == node_id).values(trial_node_id=None))

    def home_work(self, family_id: int, default: float, period: float | None) -> dict[int, float]:
        """Per node, expected seconds per cycle of the family's jobs at home there (one query).

        A job counts at its trial node while a trial is in force, else at its
        permanent node, with its learned moving average there (``default`` when
        none), weighted by how often it is due: 1/every_n_cycles, or ``period``
        / min_interval when that is less (see :func:`jodl.placement.per_cycle`).
        """
        home = func.coalesce(Job.trial_node_id, Job.permanent_node_id)
        per = literal(1.0) / func.coalesce(func.nullif(Job.every_n_cycles, 0), 1)
        if period:
            by_time = literal(float(period)) / Job.min_interval
            per = case((and_(Job.min_interval > 0, by_time < per), by_time), else_=per)
        seconds = func.coalesce(JobOnNode.recent_duration, literal(float(default)))
        query = (
            select(home, func.sum(seconds * per))
            .select_from(Job)
            .outerjoin(JobOnNode, and_(JobOnNode.job_id == Job.id, JobOnNode.node_id == home))
            .where(Job.family_id == family_id, Job.state == JobState.IDLE, home.is_not(None))
            .group_by(home)
        )
        with self.engine.connect() as conn:
            # One hash join in one process. Right after a cycle, with no statistics, a
            # nested loop probed the learned rows once per job: 2.4 s for a million
            # jobs, 1.4 s as one hash join; with statistics, a parallel plan took three
            # processes of a two-core machine, whose cycle this read runs beside.
            plans.set_local(conn, enable_nestloop="off", max_parallel_workers_per_gather="0")
            return {node: float(total or 0.0) for node, total in conn.execute(query)}

    def cycle_period(self, family_id: int, runs: int = 6) -> float | None:
        """Mean seconds between the starts of a family's last runs (None: fewer than two)."""
        with self.engine.connect() as conn:
            starts = list(
                conn.scalars(
                    select(Run.started_at)
                    .where(Run.family_id == family_id)
                    .order_by(Run.number.desc())
                    .limit(runs)
                )
            )
        if len(starts) < 2:
            return None
        return (starts[0] - starts[-1]).total_seconds() / (len(starts) - 1)


def write_homes(conn: Any, rows: Sequence[Home | tuple[int, int | None, int | None]]) -> None:
    """:meth:`Learning.set_homes` inside a transaction: one statement for the whole batch."""
    homes = [{"id": j, "permanent_node_id": p, "trial_node_id": t} for j, p, t in rows]
    bulk.update_rows(conn, table_of(Job), "id", homes)


def settle_homes(conn: Any, e: Table) -> None:
    """Jobs of a run with no home get the node that committed their result as home.

    Set-based, over a batch of outcome rows ``e`` (see :func:`learn_from_executions`),
    so the first cycle of many jobs writes no row per job from the master's loop.
    """
    conn.execute(
        bulk.prepared(
            conn,
            f"settle_homes:{e.name}",
            lambda: (
                update(Job)
                .where(
                    Job.id == e.c.job_id,
                    e.c.run_id.is_not(None),
                    e.c.state == ExecState.DONE,
                    Job.permanent_node_id.is_(None),
                    Job.trial_node_id.is_(None),
                )
                .values(permanent_node_id=e.c.node_id)
            ),
        )
    )


def learn_from_executions(conn: Any, e: Table, now: dt.datetime) -> None:
    """Fold the outcome rows of ``e`` (a table shaped like the log's) into JobOnNode.

    Runs inside the database, in the transaction that commits the outcomes (so a
    restart neither loses nor counts twice what was learned). Per (job, node):
    counts add up; means, variances (Welford/Chan) and the recent mean (weight
    :data:`~jodl.placement.RECENT_WEIGHT`) combine with what was known.
    """
    stmt = bulk.prepared(
        conn, f"learn:{e.name}", lambda: _learn_statement(conn.dialect.name, e), now=DateTime
    )
    conn.execute(stmt, {"now": now})


def _learn_statement(dialect: str, e: Table) -> Any:
    t = table_of(JobOnNode)
    done = e.c.state == ExecState.DONE
    n = func.sum(case((done, 1), else_=0))
    mean = func.avg(case((done, e.c.duration)))
    sq = func.sum(case((done, e.c.duration * e.c.duration)))
    new = (
        select(
            e.c.job_id,
            e.c.node_id,
            n.label("executions"),
            func.sum(case((e.c.state == ExecState.FAILED, 1), else_=0)).label("failures"),
            mean.label("mean_duration"),
            mean.label("recent_duration"),
            func.coalesce(sq - n * mean * mean, 0.0).label("m2"),
            mean.label("last_duration"),
            literal_column(":now").label("updated_at"),
        )
        .where(e.c.state.in_((ExecState.DONE, ExecState.FAILED)))
        .group_by(e.c.job_id, e.c.node_id)
    )
    ins = (pg_insert if dialect == "postgresql" else sqlite_insert)(t)
    stmt = ins.from_select(list(NEW_COLUMNS), new)
    old, x = t.c, stmt.excluded
    total = old.executions + x.executions
    w = RECENT_WEIGHT
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "node_id"],
        set_={
            "executions": total,
            "failures": old.failures + x.failures,
            "mean_duration": case(
                (x.executions == 0, old.mean_duration),
                (old.mean_duration.is_(None), x.mean_duration),
                else_=(old.mean_duration * old.executions + x.mean_duration * x.executions) / total,
            ),
            "m2": case(
                (x.executions == 0, old.m2),
                (old.mean_duration.is_(None), x.m2),
                else_=old.m2
                + x.m2
                + (x.mean_duration - old.mean_duration)
                * (x.mean_duration - old.mean_duration)
                * old.executions
                * x.executions
                / total,
            ),
            "recent_duration": case(
                (x.executions == 0, old.recent_duration),
                (old.recent_duration.is_(None), x.recent_duration),
                else_=w * x.recent_duration + (1 - w) * old.recent_duration,
            ),
            "last_duration": func.coalesce(x.last_duration, old.last_duration),
            "updated_at": x.updated_at,
        },
    )
    return stmt


NEW_COLUMNS = (
    "job_id",
    "node_id",
    "executions",
    "failures",
    "mean_duration",
    "recent_duration",
    "m2",
    "last_duration",
    "updated_at",
)
