"""The cycle's SQL: every statement :mod:`crawler_app.checking.cycle` runs on the page
checker's tables, as named functions (the cycle builds none of its own).

Each function works in the caller's session and transaction (or, taking an engine,
in one of its own), so a step of the cycle still commits its work at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, Row, delete, exists, func, select, update
from sqlalchemy.orm import Session

from ..models import WHOLE_PAGE, AppCycle, Page, PageView, Snapshot, Tracking

#: Job ids per ``IN (...)`` list.
IN_CHUNK = 500


def open_cycle(s: Session) -> AppCycle | None:
    """The open application cycle (at most one: a unique index), if any."""
    return s.scalar(select(AppCycle).where(AppCycle.is_open.is_(True)))


def open_cycle_step(engine: Engine) -> str | None:
    """The step of the open application cycle, or None when none is open."""
    with engine.connect() as conn:
        return conn.scalar(select(AppCycle.step).where(AppCycle.is_open.is_(True)))


def last_cycle_start(engine: Engine) -> dt.datetime | None:
    """When the most recent application cycle started (UTC, naive), if any."""
    with engine.connect() as conn:
        return conn.scalar(select(func.max(AppCycle.started_at)))


def pages_with_jobs(s: Session) -> list[Row[Any]]:
    """Each page that has a ``check_page`` job: id, url, job id, validators, browser."""
    return list(
        s.execute(
            select(
                Page.id, Page.url, Page.job_id, Page.etag, Page.last_modified, Page.browser
            ).where(Page.job_id.is_not(None))
        )
    )


def wanted_views(s: Session) -> dict[int, set[str]]:
    """Per page, the keys of the views its trackings ask for."""
    wanted: dict[int, set[str]] = {}
    for page_id, selector in s.execute(select(Tracking.page_id, Tracking.selector)):
        wanted.setdefault(page_id, set()).add(selector or WHOLE_PAGE)
    return wanted


def view_states(s: Session) -> Iterator[Row[Any]]:
    """Every view: id, page id, key, baseline fingerprint, recent fingerprints, model."""
    yield from s.execute(
        select(
            PageView.id,
            PageView.page_id,
            PageView.selector,
            PageView.fingerprint,
            PageView.recent,
            PageView.model,
        )
    )


def pages_of_jobs(s: Session, job_ids: list[int]) -> list[Page]:
    """The pages of these ``check_page`` jobs."""
    return [
        page
        for start in range(0, len(job_ids), IN_CHUNK)
        for page in s.scalars(
            select(Page).where(Page.job_id.in_(job_ids[start : start + IN_CHUNK]))
        )
    ]


def set_slot_of_analysed(s: Session, cycle_id: int, slot_at: dt.datetime) -> None:
    """The pages analysed for this cycle are next due from ``slot_at``."""
    s.execute(update(Page).where(Page.analysed_cycle_id == cycle_id).values(slot_at=slot_at))


def trim_snapshots(s: Session, cycle_id: int, keep: int) -> None:
    """Keep the newest ``keep`` snapshots of every view of the pages this cycle touched.

    One statement: the snapshots of those pages, numbered newest first per view; those
    past the limit go.
    """
    touched = select(Snapshot.page_id).where(Snapshot.cycle_id == cycle_id)
    numbered = (
        select(
            Snapshot.id,
            func.row_number()
            .over(
                partition_by=(Snapshot.page_id, Snapshot.selector),
                order_by=Snapshot.id.desc(),
            )
            .label("newest"),
        )
        .where(Snapshot.page_id.in_(touched))
        .subquery()
    )
    s.execute(
        delete(Snapshot)
        .where(Snapshot.id.in_(select(numbered.c.id).where(numbered.c.newest > keep)))
        .execution_options(synchronize_session=False)
    )


# -- the scheduler (crawler_app.checking.schedule) ----------------------------------------


def jobs_of_pages(conn: Connection, page_ids: list[int]) -> list[tuple[int, int]]:
    """(page id, job id) of these pages, those with a ``check_page`` job."""
    rows = conn.execute(
        select(Page.id, Page.job_id).where(Page.id.in_(page_ids), Page.job_id.is_not(None))
    )
    return [(page_id, job_id) for page_id, job_id in rows]


def pages_by_job(conn: Connection) -> dict[int, int]:
    """Every page with a ``check_page`` job, by job id."""
    rows = conn.execute(select(Page.job_id, Page.id).where(Page.job_id.is_not(None)))
    return dict(rows.tuples().all())


def active_schedules(
    conn: Connection, page_ids: list[int]
) -> Iterator[tuple[int, int | None, str | None]]:
    """(page id, every, cron) of each active tracking of these pages."""
    for start in range(0, len(page_ids), 1000):
        yield from conn.execute(
            select(Tracking.page_id, Tracking.every, Tracking.cron).where(
                Tracking.page_id.in_(page_ids[start : start + 1000]),
                Tracking.paused.is_(False),
            )
        ).tuples()


def anything_tracked(engine: Engine) -> bool:
    """Whether any tracking is active (paused trackings ask for no check)."""
    with engine.connect() as conn:
        return bool(conn.scalar(select(exists().where(Tracking.paused.is_(False)))))
