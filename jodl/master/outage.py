"""Database outages seen by a master: which errors are one, and how long to wait.

A master that loses its database (a PostgreSQL restart, a failover, a network cut)
cannot log its decisions, so it must not go on dispatching. It stops the way a
master that lost its lease stops (docs/architecture.md#database-outages): it lets
go of its agents and its lease and stands by, and once the database answers it
leads again, as a standby taking over would (a new epoch), resuming its unfinished
runs from the log. Nothing in memory is trusted across the outage; the log and the
agents are, so a job whose result was committed never runs again.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, PendingRollbackError

from ..exceptions import Fenced, StoreUnavailable
from ..log.store import Store

#: Seconds between two looks at a database that does not answer: short, since the
#: lease the master held is free again after one TTL anyway.
RETRY_EVERY = 0.5


class LeaseLapsed(Fenced):
    """The lease could not be renewed in time (no other master took it): the master
    stopped dispatching and leads again when the database answers."""


def reason(exc: BaseException) -> str:
    """The first line of ``exc``'s message (the driver's, when SQLAlchemy wraps it)."""
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def lease_lapsed(store: Store, epoch: int) -> bool:
    """For a master stopped for lack of renewals: True when no other master took a
    lease of its meanwhile (a lease row still has ``epoch``: a take re-stamps every
    row of the epoch it ends) or the database does not answer; False when it was
    taken over (then it stops for good, as a fenced master does)."""
    try:
        rows = store.leases()
    except Exception as exc:
        if is_outage(exc):
            return True
        raise
    return any(found == epoch for _name, _holder, found, _expires in rows)


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` says the database did not answer (not: another master leads)."""
    # PendingRollbackError: a transaction whose connection was lost, used again.
    if isinstance(exc, LeaseLapsed | StoreUnavailable | PendingRollbackError):
        return True
    if isinstance(exc, DBAPIError):
        return bool(exc.connection_invalidated) or isinstance(
            exc, OperationalError | InterfaceError
        )
    try:  # the driver's own error, raised outside SQLAlchemy (e.g. a LISTEN connection)
        import psycopg
    except ImportError:  # pragma: no cover - SQLite-only installs
        return False
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


__all__ = ["RETRY_EVERY", "LeaseLapsed", "is_outage", "lease_lapsed", "reason"]
