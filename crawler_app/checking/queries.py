"""The checking's SQL: every statement :mod:`crawler_app.checking.cycle`, the scheduler,
the analysis of check results and the baselines run on the page checker's tables, as
named functions (those modules build none of their own).

Each function works in the caller's session and transaction (or, taking an engine,
in one of its own), so a step of the cycle still commits its work at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    bindparam,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
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


# -- the analysis of check results (crawler_app.checking.analysis) ------------------------

# Columns read and written per page and per view. A chunk is applied with plain rows and
# one executemany per table: ORM objects cost more than the analysis itself.
_PAGE = Page.__table__
_VIEW = PageView.__table__
ANALYSED_PAGE_COLUMNS = ("etag", "last_modified", "title", "fingerprint", "last_status",
                         "last_error", "last_checked_at", "last_changed_at",
                         "analysed_cycle_id", "script_page", "refused_requests")  # fmt: skip
ANALYSED_VIEW_COLUMNS = ("fingerprint", "recent", "model", "last_changed_at", "problem")


def _updates(table: Any, names: tuple[str, ...]) -> Any:
    """UPDATE table SET name = :v_name, ... WHERE id = :v_id (for executemany)."""
    return (
        update(table)
        .where(table.c.id == bindparam("v_id"))
        .values({name: bindparam(f"v_{name}") for name in names})
    )


def _analysed_pages(s: Session, *where: Any) -> list[dict[str, Any]]:
    query = select(_PAGE.c.id, _PAGE.c.job_id, *(_PAGE.c[name] for name in ANALYSED_PAGE_COLUMNS))
    return [dict(row) for row in s.execute(query.where(*where)).mappings()]


def pages_to_analyse(s: Session, job_ids: list[int], cycle_id: int) -> list[dict[str, Any]]:
    """Rows (dicts of the columns analysis uses) of the pages of these jobs not yet
    analysed for this cycle."""
    return _analysed_pages(
        s,
        _PAGE.c.job_id.in_(job_ids),
        or_(_PAGE.c.analysed_cycle_id.is_(None), _PAGE.c.analysed_cycle_id != cycle_id),
    )


def analysed_pages_by_id(s: Session, page_ids: list[int]) -> list[dict[str, Any]]:
    """Rows (dicts of the columns analysis uses) of these pages."""
    return _analysed_pages(s, Page.id.in_(page_ids))


def analysed_views(s: Session, page_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Per page, rows of its views as dicts of the columns analysis uses."""
    views: dict[int, list[dict[str, Any]]] = {}
    for row in s.execute(
        select(
            _VIEW.c.id,
            _VIEW.c.page_id,
            _VIEW.c.selector,
            *(_VIEW.c[n] for n in ANALYSED_VIEW_COLUMNS),
        ).where(_VIEW.c.page_id.in_(page_ids))
    ).mappings():
        views.setdefault(row["page_id"], []).append(dict(row))
    return views


def write_analysed(
    s: Session,
    pages: list[dict[str, Any]],
    views: list[dict[str, Any]],
    snapshots: list[dict[str, Any]],
) -> None:
    """Store these page and view rows (the columns analysis uses) and new snapshots."""
    conn = s.connection()
    if pages:
        conn.execute(
            _updates(_PAGE, ANALYSED_PAGE_COLUMNS),
            [{"v_id": p["id"], **{f"v_{n}": p[n] for n in ANALYSED_PAGE_COLUMNS}} for p in pages],
        )
    if views:
        conn.execute(
            _updates(_VIEW, ANALYSED_VIEW_COLUMNS),
            [{"v_id": v["id"], **{f"v_{n}": v[n] for n in ANALYSED_VIEW_COLUMNS}} for v in views],
        )
    if snapshots:
        conn.execute(insert(Snapshot), snapshots)


def add_cycle_counts(s: Session, cycle_id: int, counts: dict[str, int]) -> None:
    """Add ``counts`` (checked, not_modified, errors, changed) to the cycle's counts."""
    s.connection().execute(
        update(AppCycle)
        .where(AppCycle.id == cycle_id)
        .values({key: getattr(AppCycle, key) + value for key, value in counts.items()})
    )


# -- baselines (crawler_app.checking.baselines) -------------------------------------------


def views_without_baseline(
    s: Session, page_ids: list[int] | None = None
) -> list[tuple[int, str, bool, str]]:
    """(page id, url, browser, selector) of each view without a baseline of a tracked
    page (not all of whose trackings are paused), of these pages if given."""
    query = (
        select(Page.id, Page.url, Page.browser, PageView.selector)
        .join(PageView, PageView.page_id == Page.id)
        .where(
            PageView.fingerprint.is_(None),
            Page.job_id.is_not(None),
            # A page whose trackings are all paused is not fetched, its baseline neither.
            Page.id.in_(select(Tracking.page_id).where(Tracking.paused.is_(False))),
        )
    )
    if page_ids is not None:
        query = query.where(Page.id.in_(page_ids))
    return [(page_id, url, browser, sel) for page_id, url, browser, sel in s.execute(query)]


def newest_tracking_since(s: Session, page_ids: list[int]) -> dict[int, dt.datetime]:
    """Per page of these, when its newest tracking began."""
    return dict(
        s.execute(
            select(Tracking.page_id, func.max(Tracking.since))
            .where(Tracking.page_id.in_(page_ids))
            .group_by(Tracking.page_id)
        )
        .tuples()
        .all()
    )


def baseline_text(s: Session, page_id: int, selector: str, fingerprint: str) -> bytes | None:
    """The compressed text of the view's newest snapshot with this fingerprint, if any."""
    return s.scalar(
        select(Snapshot.text_z)
        .where(
            Snapshot.page_id == page_id,
            Snapshot.selector == selector,
            Snapshot.fingerprint == fingerprint,
        )
        .order_by(Snapshot.id.desc())
        .limit(1)
    )


def set_view_model(s: Session, view_id: int, model: dict[str, str]) -> None:
    """Store this view's model."""
    s.execute(update(PageView).where(PageView.id == view_id).values(model=model))
