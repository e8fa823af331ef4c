"""The bytes-per-cycle budget on the master's side: what a run's results fetched.

See :mod:`jodl.log.limits` for the budgets; once a run's results pass its family's
bytes budget, the master sends none of its jobs still unsent (they stay due).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from ..log import budgets as sql
from ..log.limits import limits_of
from ..log.models import FamilyRow
from ..obs.metrics import BUDGET_EXHAUSTED, JOBS_DEFERRED

#: The bytes a result reports: its top-level ``"size"`` (inside a JSON string a quote
#: is escaped, so text of a page cannot fake it).
_SIZE = re.compile(rb'"size"\s*:\s*(\d+)')


def result_bytes(result: Any) -> int:
    """The ``size`` a job's result (JSON text) reports; 0 when it reports none."""
    if isinstance(result, str):
        result = result.encode("utf-8", "replace")
    if not isinstance(result, bytes | bytearray):
        return 0
    found = _SIZE.search(result)
    return int(found.group(1)) if found else 0


@dataclass
class RunBytes:
    """The bytes a run's results reported so far, against its family's budget."""

    family: str
    budget: int
    spent: int = 0
    #: Set once the budget is passed: the run sends nothing more.
    stopped: bool = False

    def add(self, result: Any) -> bool:
        """Count one result; True when this one passed the budget."""
        self.spent += result_bytes(result)
        if not self.stopped and self.spent >= self.budget:
            self.stopped = True
            BUDGET_EXHAUSTED.labels(self.family, "bytes_per_cycle").inc()
            return True
        return False


def run_bytes(engine: Engine, family: FamilyRow, run_id: int, resumed: bool) -> RunBytes | None:
    """The byte count of a run opening (or resumed: from its logged results), or None
    when the family has no bytes budget."""
    with engine.connect() as conn:
        most = limits_of(conn, family.id).bytes_per_cycle
    if not most:
        return None
    counter = RunBytes(family.name, most)
    if resumed:
        for result in sql.BudgetLog(engine).done_results(run_id):
            counter.spent += result_bytes(result)
        counter.stopped = counter.spent >= most
    return counter


def record_deferred(engine: Engine, run_id: int, family: str, count: int) -> None:
    """A bytes budget kept ``count`` due jobs of a run unsent: the run records them."""
    if count <= 0:
        return
    sql.BudgetLog(engine).add_deferred(run_id, count)
    JOBS_DEFERRED.labels(family, "bytes_per_cycle").inc(count)


__all__ = ["RunBytes", "record_deferred", "result_bytes", "run_bytes"]
