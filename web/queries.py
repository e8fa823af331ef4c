"""The web app's gateway: every SQL statement the web builds, each a named function.

Each function runs one statement (or one short transaction on a connection the
caller gave): callers keep their transactions (``with sessions.begin() as s``) and
pass the session or connection in. No other web module builds SQL
(``tests/test_layers.py`` checks it); the page checker's own tables are also read
through :mod:`crawler_app`'s functions where it has one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, delete, func, insert, inspect, select, text, update
from sqlalchemy.orm import Session

from crawler_app import Delivery, Notification, Page, PageView, Snapshot, Tracking, User

from .models import Batch, BatchItem, CacheReset

#: Ids per ``IN (...)`` list.
CHUNK = 500

# -- the database ----------------------------------------------------------------------------------


def ping(engine: Engine) -> None:
    """Ask the database one trivial question (raises when it does not answer)."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def has_web_tables(engine: Engine) -> bool:
    """Whether the database has the web UI's tables (its migrations ran)."""
    return inspect(engine).has_table("web_batch")


# -- users, sessions, tokens ---------------------------------------------------------------------


def user_by_id(s: Session, user_id: Any) -> User | None:
    return s.get(User, user_id)


def user_by_email(s: Session, address: str) -> User | None:
    """The user with this (normalised) address, or None."""
    return s.scalar(select(User).where(User.email == address))


def email_taken(s: Session, address: str) -> bool:
    return s.scalar(select(User.id).where(User.email == address)) is not None


def first_admin(s: Session) -> User | None:
    """The operator with the lowest id, or None."""
    return s.scalar(select(User).where(User.is_admin.is_(True)).order_by(User.id))


def admins_by_email(s: Session) -> list[User]:
    return list(s.scalars(select(User).where(User.is_admin.is_(True)).order_by(User.email)))


def bump_session_version(s: Session, user_id: int) -> None:
    """End every session and token of the user (they carry the old version)."""
    s.execute(
        update(User).where(User.id == user_id).values(session_version=User.session_version + 1)
    )


def confirm_email(s: Session, user_id: Any, address: str) -> int:
    """Mark the address of user ``user_id`` confirmed if it is still ``address``;
    the rows changed (0 or 1)."""
    result: Any = s.execute(
        update(User).where(User.id == user_id, User.email == address).values(email_confirmed=True)
    )
    return int(result.rowcount)


# -- batches and the result cache ----------------------------------------------------------------


def insert_batch(conn: Any, batch: dict[str, Any], items: Sequence[dict[str, Any]]) -> None:
    """Store a batch (``id``, ``user_id``, ``size``, ``created_at``) and its items."""
    conn.execute(insert(Batch).values(**batch))
    conn.execute(insert(BatchItem), list(items))


def batch_with_items(s: Session, batch_id: str) -> tuple[Batch, list[BatchItem]] | None:
    """A batch and its items by position, or None when there is no such batch."""
    batch = s.get(Batch, batch_id)
    if batch is None:
        return None
    rows = s.scalars(
        select(BatchItem).where(BatchItem.batch_id == batch_id).order_by(BatchItem.position)
    ).all()
    return batch, list(rows)


def delete_batches_before(conn: Any, cutoff: dt.datetime) -> None:
    """Forget the batches (and their items) created before ``cutoff``."""
    old = select(Batch.id).where(Batch.created_at < cutoff)
    conn.execute(delete(BatchItem).where(BatchItem.batch_id.in_(old)))
    conn.execute(delete(Batch).where(Batch.created_at < cutoff))


def cache_floors(conn: Any, job_ids: Sequence[int]) -> dict[int, int]:
    """``{job id: floor exec id}`` of the jobs whose cached results were reset."""
    found: dict[Any, Any] = {}
    for start in range(0, len(job_ids), CHUNK):
        rows = conn.execute(
            select(CacheReset.job_id, CacheReset.floor_exec_id).where(
                CacheReset.job_id.in_(job_ids[start : start + CHUNK])
            )
        )
        found.update(rows.tuples().all())
    return found


def replace_cache_resets(conn: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Store these cache resets (``job_id``, ``floor_exec_id``, ``user_id``,
    ``reset_at``), replacing the jobs' earlier ones."""
    conn.execute(delete(CacheReset).where(CacheReset.job_id.in_([r["job_id"] for r in rows])))
    conn.execute(insert(CacheReset), list(rows))


# -- quotas --------------------------------------------------------------------------------------


def urls_submitted_since(s: Session, user_id: int, since: dt.datetime) -> int:
    """URLs ``user_id`` submitted since ``since`` (every batch's size)."""
    return int(
        s.scalar(
            select(func.coalesce(func.sum(Batch.size), 0)).where(
                Batch.user_id == user_id, Batch.created_at > since
            )
        )
        or 0
    )


def count_trackings(s: Session, user_id: int) -> int:
    return int(s.scalar(select(func.count()).where(Tracking.user_id == user_id)) or 0)


# -- trackings, pages, snapshots -----------------------------------------------------------------


def tags_of_trackings(s: Session, user_id: int) -> list[str]:
    """Every tag of the user's trackings (repeated as often as used)."""
    rows = s.scalars(select(Tracking.tags).where(Tracking.user_id == user_id))
    return [tag for row in rows for tag in (row or [])]


def view_problems(s: Session, page_ids: Sequence[int]) -> dict[tuple[int, str], str]:
    """``{(page id, selector): problem}`` of the pages' views that have one."""
    return {
        (page_id, key): problem
        for page_id, key, problem in s.execute(
            select(PageView.page_id, PageView.selector, PageView.problem).where(
                PageView.page_id.in_(page_ids),
                PageView.problem.is_not(None),
            )
        )
    }


def view_problem(s: Session, page_id: int, selector: str) -> str | None:
    return s.scalar(
        select(PageView.problem).where(PageView.page_id == page_id, PageView.selector == selector)
    )


def page_by_id(s: Session, page_id: int) -> Page | None:
    return s.get(Page, page_id)


def tracking_by_id(s: Session, tracking_id: int) -> Tracking | None:
    return s.get(Tracking, tracking_id)


def user_tracking(
    s: Session, user_id: int, page_id: int, tracking_id: int | None = None
) -> tuple[Page, Tracking] | None:
    """The page and the user's tracking of it (``tracking_id``, else the first one)."""
    query = (
        select(Page, Tracking)
        .join(Tracking, Tracking.page_id == Page.id)
        .where(Page.id == page_id, Tracking.user_id == user_id)
        .order_by(Tracking.id)
    )
    if tracking_id is not None:
        query = query.where(Tracking.id == tracking_id)
    row = s.execute(query).first()
    return None if row is None else (row[0], row[1])


def snapshot_rows(s: Session, page_id: int, selector: str, limit: int) -> list[Any]:
    """The newest ``limit`` snapshots of a view: (id, taken_at, kind, status,
    fingerprint, chars) rows, newest first."""
    return list(
        s.execute(
            select(
                Snapshot.id,
                Snapshot.taken_at,
                Snapshot.kind,
                Snapshot.status,
                Snapshot.fingerprint,
                Snapshot.chars,
            )
            .where(Snapshot.page_id == page_id, Snapshot.selector == selector)
            .order_by(Snapshot.id.desc())
            .limit(limit)
        ).all()
    )


def snapshot_by_id(s: Session, snapshot_id: int) -> Snapshot | None:
    return s.get(Snapshot, snapshot_id)


# -- digests -------------------------------------------------------------------------------------


def recent_notifications(s: Session, user_id: int, limit: int) -> list[Notification]:
    """The user's newest ``limit`` digests, newest first."""
    return list(
        s.scalars(
            select(Notification)
            .where(Notification.user_id == user_id)
            .order_by(Notification.id.desc())
            .limit(limit)
        )
    )


def deliveries_of(s: Session, notification_ids: Sequence[int]) -> list[Delivery]:
    """The channel deliveries of these digests, in id order."""
    if not notification_ids:
        return []
    return list(
        s.scalars(
            select(Delivery)
            .where(Delivery.notification_id.in_(notification_ids))
            .order_by(Delivery.id)
        )
    )
