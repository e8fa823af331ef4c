"""Operators' requests for an application cycle now, passed to a master through the database.

The web UI (or API) records a :class:`~crawler_app.models.CycleRequest`; the
scheduler of any running master (``jodl master``, ``jodl up``) looks for
untaken requests every couple of seconds and :func:`claim` s them. Claiming is a
conditional ``UPDATE ... WHERE taken_at IS NULL`` in one transaction: of two
masters claiming at once, PostgreSQL makes the second wait for the first's row
locks and then finds nothing left to take, so a request is taken once.

Requests are **merged**: all requests pending when a master claims are served
by one cycle. A request made while a cycle runs stays pending until that cycle
ends, then the next cycle serves it (and every other request made meanwhile).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, select, update

from jodl.models import utcnow

from .models import CycleRequest, User

#: Most pending requests listed for operators.
LISTED = 20


def request_cycle(engine: Engine, user_id: int | None) -> int:
    """Record that ``user_id`` asks for a cycle now; the new request's id."""
    with engine.begin() as conn:
        new_id = conn.execute(
            CycleRequest.__table__.insert().values(user_id=user_id, requested_at=utcnow())
        ).inserted_primary_key
    assert new_id is not None
    return int(new_id[0])


def pending(engine: Engine, limit: int = LISTED) -> list[dict[str, Any]]:
    """Untaken requests, oldest first: id, who asked (e-mail), when."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(CycleRequest.id, User.email, CycleRequest.requested_at)
            .outerjoin(User, User.id == CycleRequest.user_id)
            .where(CycleRequest.taken_at.is_(None))
            .order_by(CycleRequest.id)
            .limit(limit)
        ).all()
    return [{"id": rid, "requested_by": email, "requested_at": _iso(at)} for rid, email, at in rows]


def claim(engine: Engine, taker: str) -> list[int]:
    """Take every untaken request for ``taker``; their ids (empty: none was pending).

    The first query is the cheap one a master runs every couple of seconds.
    """
    with engine.begin() as conn:
        ids = conn.scalars(
            select(CycleRequest.id).where(CycleRequest.taken_at.is_(None)).order_by(CycleRequest.id)
        ).all()
        if not ids:
            return []
        taken = conn.scalars(
            update(CycleRequest)
            .where(CycleRequest.id.in_(ids), CycleRequest.taken_at.is_(None))
            .values(taken_at=utcnow(), taken_by=taker[:255])
            .returning(CycleRequest.id)
        ).all()
    return sorted(taken)


def settle(engine: Engine, ids: Sequence[int], cycle_id: int | None) -> None:
    """Record which application cycle served the requests ``ids``."""
    if not ids or cycle_id is None:
        return
    with engine.begin() as conn:
        conn.execute(update(CycleRequest).where(CycleRequest.id.in_(ids)).values(cycle_id=cycle_id))


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds") + "Z"
