"""The digests' SQL: every statement :mod:`crawler_app.notify.digests` runs on the page
checker's tables, as named functions (the digests build none of their own).

Each function works in the caller's session and transaction: a digest row and its
``notify`` job still commit together.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from ..models import (
    WHOLE_PAGE,
    Delivery,
    Notification,
    NotificationState,
    Page,
    PageView,
    Snapshot,
    Tracking,
    User,
    UserChannel,
)


def changes_of_cycle(s: Session, cycle_id: int) -> list[Row[tuple[Snapshot, Page]]]:
    """The cycle's confirmed changes with their pages, by URL and view."""
    return list(
        s.execute(
            select(Snapshot, Page)
            .join(Page, Page.id == Snapshot.page_id)
            .where(Snapshot.cycle_id == cycle_id, Snapshot.kind == "change")
            .order_by(Page.url, Snapshot.selector)
        ).all()
    )


def view_models(s: Session, page_ids: set[int]) -> dict[tuple[int, str], Any]:
    """What each view of these pages learned to vary, by (page id, view key)."""
    return {
        (page_id, selector): model
        for page_id, selector, model in s.execute(
            select(PageView.page_id, PageView.selector, PageView.model).where(
                PageView.page_id.in_(page_ids)
            )
        )
    }


def previous_text(s: Session, snap: Snapshot) -> bytes | None:
    """The compressed text of the view's snapshot before ``snap`` (None: none)."""
    return s.scalar(
        select(Snapshot.text_z)
        .where(
            Snapshot.page_id == snap.page_id,
            Snapshot.selector == snap.selector,
            Snapshot.id < snap.id,
        )
        .order_by(Snapshot.id.desc())
        .limit(1)
    )


def trackers_to_tell(s: Session, page_id: int, selector: str) -> list[tuple[int, str]]:
    """(user id, address) of each user told of a change of this view: an active
    tracking, and an address its owner confirmed (web sign-ups follow a link)."""
    rows = s.execute(
        select(User.id, User.email)
        .join(Tracking, Tracking.user_id == User.id)
        .where(
            Tracking.page_id == page_id,
            func.coalesce(Tracking.selector, WHOLE_PAGE) == selector,
            Tracking.paused.is_(False),  # a paused tracking keeps quiet
            User.email_confirmed.is_(True),
        )
    )
    return [(user_id, email) for user_id, email in rows]


def users_with_digest(s: Session, cycle_id: int) -> set[int]:
    """Users that have a digest of this cycle already."""
    return set(s.scalars(select(Notification.user_id).where(Notification.cycle_id == cycle_id)))


def channel_ids(s: Session, user_id: int) -> list[int]:
    """The user's notification channels, oldest first."""
    return list(
        s.scalars(
            select(UserChannel.id).where(UserChannel.user_id == user_id).order_by(UserChannel.id)
        )
    )


def pending_count(s: Session, cycle_id: int) -> int:
    """E-mails and channel deliveries of the cycle not sent nor failed yet."""
    notes = s.scalar(
        select(func.count()).where(
            Notification.cycle_id == cycle_id,
            Notification.state == NotificationState.PREPARED,
        )
    )
    deliveries = s.scalar(
        select(func.count())
        .select_from(Delivery)
        .join(Notification, Notification.id == Delivery.notification_id)
        .where(Notification.cycle_id == cycle_id, Delivery.state == NotificationState.PREPARED)
    )
    return (notes or 0) + (deliveries or 0)


def prepared(s: Session, cycle_id: int) -> list[Notification | Delivery]:
    """The cycle's e-mails, then its channel deliveries, prepared and with a job."""
    notes: list[Notification | Delivery] = list(
        s.scalars(
            select(Notification).where(
                Notification.cycle_id == cycle_id,
                Notification.state == NotificationState.PREPARED,
                Notification.job_id.is_not(None),
            )
        )
    )
    notes += s.scalars(
        select(Delivery)
        .join(Notification, Notification.id == Delivery.notification_id)
        .where(
            Notification.cycle_id == cycle_id,
            Delivery.state == NotificationState.PREPARED,
            Delivery.job_id.is_not(None),
        )
    )
    return notes
