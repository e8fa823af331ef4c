"""Per-family budgets as the log applies them: jobs per cycle, on-demand jobs per hour, bytes.

A family's budgets are ``JODL_FAMILY_*`` defaults unless the family has its own
(``jodl budget set NAME ...``, a :class:`jodl.log.models.FamilyBudget` row; 0 is no
limit). What each one does, and why it is cheap:

* **jobs per cycle** (N): a run opens with at most N of its due jobs, oldest-due
  first (order: the run they last ran in, never-run first, then id); the rest wait
  for the next run, and the run records how many (``Run.deferred``). The run does
  not list its members: it keeps the last member's (run number, id) as a cut, and
  the membership rule (:mod:`jodl.log.runs`) adds ``(last run, id) <= cut``, so
  a resumed run has exactly the same jobs. One ordered query when the run opens.
* **on-demand jobs per hour** (N): the queue's claim takes at most N jobs of the
  family per clock hour; the others stay queued, not lost, and are claimed in the
  next hour. The count is one row per family, updated by the claim's own
  transaction; while any family has an hourly budget every claim locks those rows
  first, so concurrent claimers count in turn (claims then wait on each other).
* **bytes per cycle** (B): the master adds up the ``size`` that results of the
  run report (a check_page result carries the bytes it fetched) and once they pass
  B sends none of the run's jobs still unsent: they stay due, and the next run
  has them first. Only runs of a family with a bytes budget look at their results.

Every time a budget holds work back, ``jodl_budget_exhausted_total{family,budget}``
counts it, and ``jodl_jobs_deferred_total`` counts the jobs a cycle put off.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter as Tally
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from ..exceptions import ConfigError
from ..obs.metrics import BUDGET_EXHAUSTED, JOBS_DEFERRED
from ..settings.config import read_values
from ..settings.options import Option, register_options
from . import budgets as sql
from .models import FamilyRow, Run

# -- settings -----------------------------------------------------------------------------------


def _whole(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected a whole number >= 0 (0: no limit), got {text!r}")
    return value


class BudgetOption(Option):
    """An option whose value is a whole number >= 0 (0: no limit)."""

    def parse(self, text: str) -> Any:
        try:
            return _whole(text)
        except ValueError as exc:
            raise ConfigError(f"{self.name}: {exc}") from None


OPTIONS: tuple[Option, ...] = (
    BudgetOption(
        "JODL_FAMILY_JOBS_PER_CYCLE",
        "0",
        "int0",
        "Jobs a cycle of a family runs at most (0: no limit); the rest wait for the next "
        "cycle, oldest-due first. Per family: jodl budget set NAME --jobs-per-cycle N",
        "master",
    ),
    BudgetOption(
        "JODL_FAMILY_ONDEMAND_PER_HOUR",
        "0",
        "int0",
        "On-demand jobs of a family claimed per clock hour at most (0: no limit); the others "
        "stay queued. Per family: jodl budget set NAME --ondemand-per-hour N",
        "master",
    ),
    BudgetOption(
        "JODL_FAMILY_BYTES_PER_CYCLE",
        "0",
        "int0",
        'Bytes a cycle of a family may fetch, as its results report them ("size", e.g. '
        "check_page); once passed, the cycle sends no more jobs (0: no limit). Per family: "
        "jodl budget set NAME --bytes-per-cycle N",
        "master",
    ),
)
register_options(OPTIONS)

#: The budgets, as named in the CLI, errors and metrics.
BUDGETS = sql.BUDGET_COLUMNS


@dataclass(frozen=True)
class Limits:
    """A family's budgets in effect (0: no limit)."""

    jobs_per_cycle: int = 0
    ondemand_per_hour: int = 0
    bytes_per_cycle: int = 0

    @classmethod
    def defaults(cls, env: Mapping[str, str] | None = None) -> Limits:
        """The ``JODL_FAMILY_*`` settings."""
        values = read_values(OPTIONS, env)
        return cls(**{f.name: values["family_" + f.name] for f in fields(cls)})

    def over(self, row: Any) -> Limits:
        """These defaults with a family's own budgets over them."""
        if row is None:
            return self
        return Limits(
            **{
                f.name: getattr(self, f.name)
                if getattr(row, f.name) is None
                else getattr(row, f.name)
                for f in fields(self)
            }
        )


def limits_of(conn: Session | Any, family_id: int, defaults: Limits | None = None) -> Limits:
    """The budgets in effect for a family, read on ``conn`` (a session or a connection)."""
    return (defaults or Limits.defaults()).over(sql.own_budgets(conn, family_id))


# -- jobs per cycle -----------------------------------------------------------------------------


def cut_run(
    s: Session, run: Run, family: FamilyRow, members: tuple[Any, ...], recent: set[int]
) -> None:
    """Apply the family's jobs-per-cycle budget to a run being opened.

    ``members`` is the run's membership rule and ``recent`` the due jobs it excludes
    (not more often than T); ``run.jobs_total`` holds how many jobs are due.
    """
    most = limits_of(s, family.id).jobs_per_cycle
    if not most or run.jobs_total <= most:
        return
    keys = sql.first_due(s, members, most + len(recent))
    kept = [k for k in keys if k[1] not in recent][:most]
    run.cut_number, run.cut_job_id = int(kept[-1][0]), int(kept[-1][1])
    run.deferred = run.jobs_total - most
    run.jobs_total = most
    BUDGET_EXHAUSTED.labels(family.name, "jobs_per_cycle").inc()
    JOBS_DEFERRED.labels(family.name, "jobs_per_cycle").inc(run.deferred)


def after_run(s: Session, run: Run) -> None:
    """A run that put jobs off: those it ran go after them in the next run's order.

    Jobs of a family without every-N-cycles or "not more often than T" do not keep
    their last run otherwise; one statement, only for runs a budget cut short.
    """
    if run.deferred:
        sql.ran_in(s, run)


# -- on-demand jobs per hour ----------------------------------------------------------------

#: Seconds a queue keeps its list of families with an hourly budget before reading it
#: again: a budget set by an operator applies within this long, and a claim costs no
#: extra query in between when no family has one.
HOURLY_REFRESH = 5.0

#: One claim statement: extra conditions on the due jobs, how many to take; its rows
#: (id, family_id, ...).
ClaimStatement = Callable[[tuple[Any, ...], int], Sequence[Any]]


class HourlyBudgets:
    """The on-demand queue's side of the per-hour budgets (one per :class:`Queue`)."""

    def __init__(self, engine: Engine) -> None:
        self.log = sql.BudgetLog(engine)
        self._per_hour: dict[int, int] = {}
        self._read_at = -HOURLY_REFRESH
        #: (family id, hour) whose exhaustion was counted already (once per hour).
        self._counted: set[tuple[int, dt.datetime]] = set()

    def per_hour(self) -> dict[int, int]:
        """family id -> on-demand jobs it may have claimed per hour (only those with one)."""
        if time.monotonic() - self._read_at < HOURLY_REFRESH:
            return self._per_hour
        defaults = Limits.defaults()
        fids, own = self.log.hourly()
        missing = [f for f in fids if f not in own]
        per_hour = {}
        for fid in fids:
            most = own.get(fid)
            most = defaults.ondemand_per_hour if most is None else most
            if most:
                per_hour[fid] = most
        # A family under a default budget needs its row to count claims in.
        for fid in (f for f in missing if f in per_hour):
            self.log.add_row(fid)
        self._per_hour, self._read_at = per_hour, time.monotonic()
        return per_hour

    def claim(
        self,
        conn: Any,
        per_hour: dict[int, int],
        now: dt.datetime,
        limit: int,
        statement: ClaimStatement,
    ) -> list[Any]:
        """Claim up to ``limit`` jobs in ``conn``'s transaction within the hourly budgets.

        Families with room for the whole claim are claimed together, in the queue's
        order; a family with less room gets only that, after them; a family with no
        room left none (its jobs stay queued until the next hour).
        """
        hour = now.replace(minute=0, second=0, microsecond=0)
        fids = list(per_hour)
        # Every budgeted family's row is written first, so concurrent claimers count in turn.
        used = sql.start_hour(conn, fids, hour)
        room = {f: max(0, per_hour[f] - used.get(f, 0)) for f in fids}
        tight = [f for f in fids if room[f] < limit]
        rows = list(statement((sql.not_families(tight),) if tight else (), limit))
        for fid in tight:
            if room[fid] and len(rows) < limit:
                rows += statement((sql.of_family(fid),), min(room[fid], limit - len(rows)))
        taken = Tally(r[1] for r in rows if r[1] in room)
        sql.count_claimed(conn, taken)
        for fid in fids:
            if room[fid] - taken.get(fid, 0) <= 0 and (fid, hour) not in self._counted:
                self._counted.add((fid, hour))
                BUDGET_EXHAUSTED.labels(sql.family_name(conn, fid), "ondemand_per_hour").inc()
        return rows


__all__ = [
    "BUDGETS",
    "OPTIONS",
    "ClaimStatement",
    "HourlyBudgets",
    "Limits",
    "after_run",
    "cut_run",
    "limits_of",
]
