"""Statements of the families' budgets (the policy is :mod:`jodl.admin.budget`'s).

A family's own budgets are one ``jodl_family_budget`` row (NULL: the default);
the same row counts the on-demand jobs claimed in the current clock hour.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, case, func, insert, literal, or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ..exceptions import JodlError
from .models import ExecState, Execution, FamilyBudget, FamilyRow, Job, Run

#: The budget columns of a family's row, as named in the CLI, errors and metrics.
BUDGET_COLUMNS = ("jobs_per_cycle", "ondemand_per_hour", "bytes_per_cycle")


def own_budgets(conn: Session | Any, family_id: int) -> Any:
    """The family's own budgets row (attributes named as :data:`BUDGET_COLUMNS`), or None."""
    return conn.execute(
        select(*(getattr(FamilyBudget, name) for name in BUDGET_COLUMNS)).where(
            FamilyBudget.family_id == family_id
        )
    ).first()


# -- jobs per cycle -------------------------------------------------------------------------


def oldest_due() -> tuple[Any, Any]:
    """Oldest-due first: never run, then by the run they last ran in; then by id."""
    return func.coalesce(Job.last_run_number, 0), Job.id


def member_cut(run: Run) -> tuple[Any, ...]:
    """The extra membership condition of a run cut by a jobs-per-cycle budget."""
    if run.cut_job_id is None:
        return ()
    cut = tuple_(literal(run.cut_number or 0), literal(run.cut_job_id))
    return (tuple_(*oldest_due()) <= cut,)


def first_due(s: Session, members: tuple[Any, ...], count: int) -> list[tuple[int, int]]:
    """The (last run, id) order keys of the first ``count`` members, oldest-due first."""
    rows = s.execute(
        select(*oldest_due()).where(*members).order_by(*oldest_due()).limit(count)
    ).all()
    return [(int(number), int(job_id)) for number, job_id in rows]


def ran_in(s: Session, run: Run) -> None:
    """The family's jobs with a result in ``run`` record it as their last run."""
    done_here = (
        select(Execution.id)
        .where(
            Execution.run_id == run.id,
            Execution.job_id == Job.id,
            Execution.state == ExecState.DONE,
        )
        .exists()
    )
    s.execute(
        update(Job)
        .where(Job.family_id == run.family_id, done_here)
        .values(last_run_number=run.number)
        .execution_options(synchronize_session=False)
    )


# -- on-demand jobs per hour ---------------------------------------------------------------


def not_families(family_ids: Sequence[int]) -> Any:
    """The claim condition "of none of these families"."""
    return Job.family_id.not_in(list(family_ids))


def of_family(family_id: int) -> Any:
    """The claim condition "of this family"."""
    return Job.family_id == family_id


def start_hour(conn: Any, family_ids: Sequence[int], hour: dt.datetime) -> dict[int, int]:
    """Lock the families' rows (a new clock hour counts from 0); jobs claimed so far.

    Written first, so the rows are locked (PostgreSQL) or the database is (SQLite)
    until the claim commits: concurrent claimers count in turn.
    """
    stale = or_(FamilyBudget.hour_start.is_(None), FamilyBudget.hour_start < hour)
    conn.execute(
        update(FamilyBudget)
        .where(FamilyBudget.family_id.in_(list(family_ids)))
        .values(hour_used=case((stale, 0), else_=FamilyBudget.hour_used), hour_start=hour)
    )
    return dict(
        conn.execute(
            select(FamilyBudget.family_id, FamilyBudget.hour_used).where(
                FamilyBudget.family_id.in_(list(family_ids))
            )
        )
        .tuples()
        .all()
    )


def count_claimed(conn: Any, taken: Mapping[int, int]) -> None:
    """Add the jobs just claimed to their families' hourly counts."""
    for fid, count in taken.items():
        conn.execute(
            update(FamilyBudget)
            .where(FamilyBudget.family_id == fid)
            .values(hour_used=FamilyBudget.hour_used + count)
        )


def family_name(conn: Any, family_id: int) -> str:
    return str(conn.scalar(select(FamilyRow.name).where(FamilyRow.id == family_id)))


class BudgetLog:
    """Reads and writes of families' budgets outside a claim's transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def family_names(self) -> list[str]:
        with self.sessions() as s:
            return list(s.scalars(select(FamilyRow.name).order_by(FamilyRow.name)))

    def own(self, names: Sequence[str]) -> list[tuple[str, Any]]:
        """(family, its own budgets row or None) for these families, in order."""
        with self.sessions() as s:
            return [(name, own_budgets(s, _family(s, name).id)) for name in names]

    def set_own(self, name: str, changes: Mapping[str, int | None]) -> FamilyBudget:
        """Set some of the family's own budgets (None: back to the default)."""
        with self.sessions() as s, s.begin():
            family = _family(s, name)
            row = s.get(FamilyBudget, family.id)
            if row is None:
                row = FamilyBudget(family_id=family.id, hour_used=0)
                s.add(row)
            for key, value in changes.items():
                setattr(row, key, value)
            s.flush()
            return row

    def hourly(self) -> tuple[list[int], dict[int, int | None]]:
        """Every family id, and the own on-demand hourly budget of those with a row."""
        with self.engine.connect() as conn:
            own: dict[int, int | None] = dict(
                conn.execute(select(FamilyBudget.family_id, FamilyBudget.ondemand_per_hour))
                .tuples()
                .all()
            )
            fids = list(conn.scalars(select(FamilyRow.id)))
        return fids, own

    def add_row(self, family_id: int) -> None:
        """Give a family its budget row (to count claims in); nothing if it has one."""
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(FamilyBudget).values(family_id=family_id, hour_used=0))
        except IntegrityError:
            pass  # added meanwhile by another process

    def done_results(self, run_id: int) -> Iterator[str | None]:
        """The result texts committed in a run so far."""
        with self.engine.connect() as conn:
            yield from conn.scalars(
                select(Execution.result).where(
                    Execution.run_id == run_id, Execution.state == ExecState.DONE
                )
            )

    def add_deferred(self, run_id: int, count: int) -> None:
        """A run records ``count`` more due jobs a budget put off."""
        with self.engine.begin() as conn:
            conn.execute(update(Run).where(Run.id == run_id).values(deferred=Run.deferred + count))


def _family(s: Session, name: str) -> FamilyRow:
    family = s.scalar(select(FamilyRow).where(FamilyRow.name == name))
    if family is None:
        known = ", ".join(s.scalars(select(FamilyRow.name).order_by(FamilyRow.name))) or "none"
        raise JodlError(f"no family {name!r} (families: {known})")
    return family
