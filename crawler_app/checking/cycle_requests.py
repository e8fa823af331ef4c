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

Operators see each recent request in one :class:`RequestState` (:func:`recent`).

This module is the gateway of :class:`~crawler_app.models.CycleRequest`: the web UI,
the commands and the scheduler go through its functions (tests/test_layers.py).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, or_, select, update
from sqlalchemy.orm import Session

from jodl.exceptions import JodlError
from jodl.log import Store, utcnow

from ..models import AppCycle, CycleRequest, User
from .cycle import CycleResult, OnStep

#: Most pending requests listed for operators.
LISTED = 20
#: Seconds a taken request stays listed for operators after it was taken: long enough
#: to see the cycle it asked for run and end, short enough not to pile up.
SHOWN_AFTER_TAKEN = 3600.0


class RequestState(StrEnum):
    """Where an operator's request is, as the operators' page says it."""

    WAITING = "waiting"  # no master took it yet
    RUNNING = "running"  # taken; its cycle runs (or a failed one waits to resume)
    DONE = "done"  # its cycle ended
    NO_CYCLE = "no cycle"  # taken, but no cycle ran: nothing was tracked


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


def recent(
    engine: Engine, limit: int = LISTED, now: dt.datetime | None = None
) -> list[dict[str, Any]]:
    """Pending requests and those taken in the last :data:`SHOWN_AFTER_TAKEN` seconds,
    oldest first: id, who asked, when, their :class:`RequestState`, who took them.

    A taken request names its cycle only once the cycle ended (:func:`settle`): until
    then the open cycle is the one serving it.
    """
    since = (now or utcnow()) - dt.timedelta(seconds=SHOWN_AFTER_TAKEN)
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                CycleRequest.id,
                User.email,
                CycleRequest.requested_at,
                CycleRequest.taken_at,
                CycleRequest.taken_by,
                CycleRequest.cycle_id,
                AppCycle.is_open,
            )
            .outerjoin(User, User.id == CycleRequest.user_id)
            .outerjoin(AppCycle, AppCycle.id == CycleRequest.cycle_id)
            .where(or_(CycleRequest.taken_at.is_(None), CycleRequest.taken_at >= since))
            .order_by(CycleRequest.id.desc())
            .limit(limit)
        ).all()
        open_cycle = conn.scalar(select(AppCycle.id).where(AppCycle.is_open.is_(True)))
    listed = []
    for rid, email, at, taken_at, taken_by, cycle_id, cycle_open in reversed(rows):
        if taken_at is None:
            state = RequestState.WAITING
        elif cycle_id is not None:
            state = RequestState.RUNNING if cycle_open else RequestState.DONE
        else:
            state = RequestState.RUNNING if open_cycle is not None else RequestState.NO_CYCLE
        listed.append(
            {
                "id": rid,
                "requested_by": email,
                "requested_at": _iso(at),
                "state": str(state),
                "taken_by": taken_by,
                "cycle_id": cycle_id,
            }
        )
    return listed


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


#: Seconds between two looks at a followed request and its cycle.
FOLLOW_POLL = 0.3
#: Seconds a taken request may show no cycle before following gives up (the master
#: found nothing to do, or the cycle failed at once: its log says which).
NO_CYCLE_GRACE = 15.0


def follow(
    engine: Engine,
    request_id: int,
    master_alive: Callable[[], bool],
    on_step: OnStep | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CycleResult:
    """Follow the cycle serving request ``request_id`` to its end; its result.

    ``on_step`` hears each step the master reaches, ``progress`` the jobs done of
    the step's JODL run. :class:`JodlError` when the master stops first.
    """
    store = Store(engine)
    followed: int | None = None
    step: str | None = None
    taken_at: float | None = None
    while True:
        with Session(engine) as s:
            taken, cycle_id = s.execute(
                select(CycleRequest.taken_at, CycleRequest.cycle_id).where(
                    CycleRequest.id == request_id
                )
            ).one()
            cycle = s.scalar(select(AppCycle).where(AppCycle.is_open.is_(True)))
        if taken is not None:
            taken_at = taken_at or time.monotonic()
            if cycle_id is not None and (cycle is None or cycle.id != cycle_id):
                return _result(engine, cycle_id)  # served and recorded
            if cycle is not None and followed in (None, cycle.id):
                followed = cycle.id
                if cycle.step != step:
                    step = cycle.step
                    if on_step is not None:
                        on_step(step)
                run_id = {"check": cycle.check_run_id, "send": cycle.notify_run_id}.get(step)
                if progress is not None and run_id is not None:
                    _report_run(store, run_id, progress)
            elif followed is not None:
                return _result(engine, followed)  # it ended between two looks
            elif time.monotonic() - taken_at > NO_CYCLE_GRACE:
                raise JodlError(
                    "the running master took the request but ran no cycle "
                    "(nothing tracked, or the cycle failed: see its log)"
                )
        if not master_alive():
            raise JodlError(
                "the running master stopped before the cycle ended; "
                "it resumes at its step on the next start"
            )
        time.sleep(FOLLOW_POLL)


def _report_run(store: Store, run_id: int, progress: Callable[[int, int], None]) -> None:
    run = store.reads.run(run_id)
    total = run.jobs_total if run is not None else 0
    if total:
        done, _ = store.count_run(run_id)
        progress(min(done, total), total)


def _result(engine: Engine, cycle_id: int) -> CycleResult:
    with Session(engine) as s:
        c = s.get_one(AppCycle, cycle_id)
    elapsed = ((c.finished_at or utcnow()) - c.started_at).total_seconds()
    return CycleResult(
        c.id,
        False,
        c.pages,
        c.checked,
        c.not_modified,
        c.errors,
        c.changed,
        c.notifications,
        c.sent,
        elapsed,
    )


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds") + "Z"
