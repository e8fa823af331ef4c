"""The enqueue statement: one upsert of any number of keys (see :mod:`jodl.queue`).

Enqueueing an existing key updates it in place: a queued job takes the new
due time and payload and keeps the higher priority; a running (claimed) job
stays claimed and runs once more after this run; a done, dead or deleted job is
queued afresh. Built once at import, for PostgreSQL (the keys and payloads as
two arrays: one statement and one plan for any batch) and for SQLite (an
executemany with RETURNING).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    DateTime,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite

from .models import Job, JobState


def _on_conflict(ins: Any) -> Any:
    """What enqueueing an existing key does (see :mod:`jodl.queue`)."""
    new = ins.excluded
    # No IN (...): expanding parameters cannot go with executemany.
    live = or_(Job.state == JobState.QUEUED, Job.state == JobState.CLAIMED)
    claimed = Job.state == JobState.CLAIMED
    return ins.on_conflict_do_update(
        index_elements=[Job.family_id, Job.key],
        set_={
            # A running job stays claimed; its due_at (cleared by the claim) now
            # says "run once more after this run", at the new due time.
            "state": case((claimed, JobState.CLAIMED), else_=JobState.QUEUED),
            "due_at": new.due_at,
            "payload": new.payload,
            "priority": case(
                (and_(live, Job.priority > new.priority), Job.priority), else_=new.priority
            ),
            "failures": case((live, Job.failures), else_=0),
            "lease_until": case((claimed, Job.lease_until), else_=None),
            "last_error": case((live, Job.last_error), else_=None),
            "updated_at": new.updated_at,
        },
    ).returning(Job.id, Job.key)


def _unnest_upsert() -> Any:
    rows = (
        func.unnest(
            # Each a text array's own text (bulk.text_array), cast here.
            cast(bindparam("keys", type_=Text), postgresql.ARRAY(String)),
            cast(bindparam("payloads", type_=Text), postgresql.ARRAY(Text)),
        )
        .table_valued("k", "p")
        .render_derived()
    )
    source = select(
        bindparam("fid", type_=Integer),
        rows.c.k,
        rows.c.p,
        bindparam("prio", type_=Integer),
        literal(JobState.QUEUED),
        literal(1),
        bindparam("due", type_=DateTime),
        literal(0),
        literal(0),
        bindparam("now", type_=DateTime),
        bindparam("now", type_=DateTime),
    )
    columns = ["family_id", "key", "payload", "priority", "state", "every_n_cycles"]
    columns += ["due_at", "attempts", "failures", "created_at", "updated_at"]
    return _on_conflict(postgresql.insert(Job).from_select(columns, source))


#: PostgreSQL: parameters fid, prio, due, now and the arrays keys and payloads
#: (:func:`jodl.log.bulk.text_array`).
UPSERT_UNNEST = _unnest_upsert()
#: SQLite: one parameter set per job (all the row's columns).
UPSERT_SQLITE = _on_conflict(sqlite.insert(Job))
