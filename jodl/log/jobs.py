"""Jobs an application keeps in step with its own tables, in the application's transaction.

The page checker gives every tracked page a job and every digest a job, and must
commit them with its own rows: these methods take the caller's connection (a
session's ``connection()``) and never commit themselves.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, DateTime, and_, bindparam, insert, select, update

from .models import ExecState, Execution, FamilyRow, Job, JobState, RequestKind, table_of, utcnow
from .requests import RequestLog

#: Ids or keys per ``IN (...)`` list.
CHUNK = 1000


class JobLine(NamedTuple):
    """A job's state and every-N-cycles, as an application syncing its jobs reads them."""

    job_id: int
    state: str
    every_n_cycles: int


class RunOutcome(NamedTuple):
    """How a job fared in one run: its state and last error, and its result if committed."""

    job_id: int
    state: str
    error: str | None
    result: str | None


class JobLog:
    """Creating, reviving and retiring jobs inside an application's transaction."""

    @staticmethod
    def family_id(conn: Connection, name: str, **fields: Any) -> int:
        """Id of the family ``name``, created with ``fields`` on first use."""
        fid = conn.scalar(select(FamilyRow.id).where(FamilyRow.name == name))
        if fid is None:
            fid = conn.execute(
                insert(FamilyRow)
                .values(name=name, created_at=utcnow(), **fields)
                .returning(FamilyRow.id)
            ).scalar_one()
        return int(fid)

    @staticmethod
    def lines(conn: Connection, job_ids: Sequence[int]) -> dict[int, JobLine]:
        """job id -> its state and every-N-cycles, for the jobs that exist."""
        out: dict[int, JobLine] = {}
        ids = list(job_ids)
        for start in range(0, len(ids), CHUNK):
            for row in conn.execute(
                select(Job.id, Job.state, Job.every_n_cycles).where(
                    Job.id.in_(ids[start : start + CHUNK])
                )
            ):
                out[row[0]] = JobLine(*row)
        return out

    @staticmethod
    def ids_by_key(conn: Connection, family_id: int, keys: Sequence[str]) -> dict[str, int]:
        """key -> job id of the family's jobs with these keys."""
        found: dict[str, int] = {}
        for start in range(0, len(keys), CHUNK):
            found.update(
                conn.execute(
                    select(Job.key, Job.id).where(
                        Job.family_id == family_id, Job.key.in_(list(keys[start : start + CHUNK]))
                    )
                )
                .tuples()
                .all()
            )
        return found

    @staticmethod
    def add_idle(
        conn: Connection, family_id: int, jobs: Iterable[tuple[str, str, int]]
    ) -> list[str]:
        """Add idle jobs (key, payload JSON, every N cycles); the keys added."""
        now = utcnow()
        rows = [
            {
                "family_id": family_id,
                "key": key,
                "payload": payload,
                "state": JobState.IDLE,
                "every_n_cycles": every,
                "priority": 0,
                "attempts": 0,
                "created_at": now,
                "updated_at": now,
            }
            for key, payload, every in jobs
        ]
        if rows:
            conn.execute(insert(Job), rows)
        return [str(r["key"]) for r in rows]

    @staticmethod
    def add_one(conn: Connection, family_id: int, key: str, payload: str) -> int:
        """Add one idle job; its id."""
        now = utcnow()
        return int(
            conn.execute(
                insert(Job)
                .values(
                    family_id=family_id,
                    key=key,
                    payload=payload,
                    state=JobState.IDLE,
                    created_at=now,
                    updated_at=now,
                )
                .returning(Job.id)
            ).scalar_one()
        )

    @staticmethod
    def revive(conn: Connection, jobs: Sequence[tuple[int, int]]) -> None:
        """Jobs (id, every N cycles) back into the cycles: idle, attempts reset."""
        if not jobs:
            return
        table = table_of(Job)
        conn.execute(
            update(table)
            .where(table.c.id == bindparam("jid"))
            .values(
                state=JobState.IDLE,
                every_n_cycles=bindparam("every"),
                attempts=0,
                updated_at=utcnow(),
            ),
            [{"jid": jid, "every": every} for jid, every in jobs],
        )

    @staticmethod
    def set_due(conn: Connection, family_id: int, due: Mapping[str, dt.datetime | None]) -> int:
        """Give idle jobs of the family (key -> time) a due time: no run that opens
        before it takes the job; None: due in any run again (the default). Naive UTC
        times, as :func:`utcnow` gives. One statement for all; how many jobs it set.

        Jobs in another state keep theirs (a queued job's due time is the queue's).
        """
        if not due:
            return 0
        table = table_of(Job)
        result = conn.execute(
            update(table)
            .where(
                table.c.family_id == bindparam("fid"),
                table.c.key == bindparam("k"),
                table.c.state == JobState.IDLE,
            )
            .values(due_at=bindparam("due", type_=DateTime())),
            [{"fid": family_id, "k": key, "due": when} for key, when in due.items()],
        )
        return int(result.rowcount)

    @staticmethod
    def delete(conn: Connection, job_ids: Sequence[int]) -> None:
        """Jobs never dispatched again (kept, marked deleted).

        With them, one :data:`RequestKind.DELETE` request per family they belong to:
        a running master takes it and cancels those of them it holds (in flight:
        on their agents).
        """
        ids = list(job_ids)
        if not ids:
            return
        families: set[str] = set()
        for start in range(0, len(ids), CHUNK):
            part = ids[start : start + CHUNK]
            families.update(
                conn.scalars(
                    select(FamilyRow.name)
                    .join(Job, Job.family_id == FamilyRow.id)
                    .where(Job.id.in_(part), Job.state != JobState.DELETED)
                    .distinct()
                )
            )
            conn.execute(
                update(Job)
                .where(Job.id.in_(part))
                .values(state=JobState.DELETED, updated_at=utcnow())
            )
        RequestLog.file(conn, families, RequestKind.DELETE)

    @staticmethod
    def deleted_among(conn: Connection, job_ids: Sequence[int]) -> list[int]:
        """Which of ``job_ids`` are deleted."""
        ids = list(job_ids)
        out: list[int] = []
        for start in range(0, len(ids), CHUNK):
            out.extend(
                conn.scalars(
                    select(Job.id).where(
                        Job.id.in_(ids[start : start + CHUNK]), Job.state == JobState.DELETED
                    )
                )
            )
        return out

    @staticmethod
    def ids_of_keys(conn: Connection, family: str, keys: Sequence[str]) -> dict[str, int]:
        """key -> job id of those of ``keys`` that ``family`` has and did not delete."""
        out: dict[str, int] = {}
        for start in range(0, len(keys), CHUNK):
            for job_id, key in conn.execute(
                select(Job.id, Job.key)
                .join(FamilyRow, FamilyRow.id == Job.family_id)
                .where(
                    FamilyRow.name == family,
                    Job.key.in_(list(keys[start : start + CHUNK])),
                    Job.state != JobState.DELETED,
                )
            ):
                out[key] = job_id
        return out

    @staticmethod
    def retire(conn: Connection, job_ids: Sequence[int]) -> None:
        """Idle jobs of these ends as done: no later run sends them again."""
        if job_ids:
            conn.execute(
                update(Job)
                .where(Job.id.in_(list(job_ids)), Job.state == JobState.IDLE)
                .values(state=JobState.DONE, updated_at=utcnow())
            )

    @staticmethod
    def outcomes(conn: Connection, job_ids: Sequence[int], run_id: int) -> dict[int, RunOutcome]:
        """job id -> how it fared in run ``run_id`` (its result there, if committed)."""
        out: dict[int, RunOutcome] = {}
        ids = list(job_ids)
        for start in range(0, len(ids), CHUNK):
            for row in conn.execute(
                select(Job.id, Job.state, Job.last_error, Execution.result)
                .outerjoin(
                    Execution,
                    and_(
                        Execution.job_id == Job.id,
                        Execution.run_id == run_id,
                        Execution.state == ExecState.DONE,
                    ),
                )
                .where(Job.id.in_(ids[start : start + CHUNK]))
            ):
                out[row[0]] = RunOutcome(*row)
        return out
