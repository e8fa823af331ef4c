"""Per-family budgets, for operators and command plug-ins (``jodl budget``).

How each budget works is told in :mod:`jodl.log.limits`, where the log applies
them; the master counts a run's bytes in :mod:`jodl.master.bytes_budget`.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine

from ..exceptions import JodlError
from ..log import budgets as sql
from ..log.limits import (
    BUDGETS,
    OPTIONS,
    HourlyBudgets,
    Limits,
    after_run,
    cut_run,
    limits_of,
)
from ..master.bytes_budget import RunBytes, record_deferred, result_bytes, run_bytes


class Budgets:
    """Reading and setting families' budgets."""

    def __init__(self, engine: Engine) -> None:
        self.log = sql.BudgetLog(engine)

    def show(self, names: Iterable[str] | None = None) -> list[tuple[str, Limits, Limits]]:
        """(family, its budgets in effect, the defaults) for these families (all: None)."""
        defaults = Limits.defaults()
        wanted = list(names) if names else self.log.family_names()
        return [(name, defaults.over(row), defaults) for name, row in self.log.own(wanted)]

    def set(self, name: str, **changes: int | None) -> Limits:
        """Set some budgets of family ``name`` (None: back to the default; 0: no limit)."""
        for key, value in changes.items():
            if key not in BUDGETS:
                raise JodlError(f"no budget {key!r}; budgets: {', '.join(BUDGETS)}")
            if value is not None and (isinstance(value, bool) or value < 0):
                raise JodlError(f"{key}: a whole number >= 0 (0: no limit), got {value!r}")
        return Limits.defaults().over(self.log.set_own(name, changes))


__all__ = [
    "BUDGETS",
    "OPTIONS",
    "Budgets",
    "HourlyBudgets",
    "Limits",
    "RunBytes",
    "after_run",
    "cut_run",
    "limits_of",
    "record_deferred",
    "result_bytes",
    "run_bytes",
]
