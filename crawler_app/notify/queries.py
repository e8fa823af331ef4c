"""The notifications' SQL: every statement :mod:`crawler_app.notify.digests`,
:mod:`crawler_app.notify.channels` and :mod:`crawler_app.notify.feeds` run on the page
checker's tables, as named functions (those modules build none of their own).

Each function works in the caller's session and transaction: a digest row and its
``notify`` job still commit together.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, func, select, true
from sqlalchemy.orm import Session, aliased

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


# -- channels ----------------------------------------------------------------------------------


def channel_urls(s: Session, user_id: int) -> list[str]:
    """The URLs of the user's channels."""
    return list(s.scalars(select(UserChannel.url).where(UserChannel.user_id == user_id)))


def channels_of(s: Session, user_id: int) -> list[UserChannel]:
    """The user's channels, oldest first."""
    return list(
        s.scalars(
            select(UserChannel).where(UserChannel.user_id == user_id).order_by(UserChannel.id)
        )
    )


def channel_by_id(s: Session, user_id: int, channel_id: int) -> UserChannel | None:
    """The user's channel ``channel_id``, or None if the user has none such."""
    return s.scalar(
        select(UserChannel).where(UserChannel.id == channel_id, UserChannel.user_id == user_id)
    )


# -- feeds -------------------------------------------------------------------------------------


def tracking_tags(s: Session, user_id: int) -> list[tuple[int, list[str] | None]]:
    """(tracking id, tags) of each of the user's trackings."""
    rows = s.execute(select(Tracking.id, Tracking.tags).where(Tracking.user_id == user_id))
    return [(tracking_id, tags) for tracking_id, tags in rows]


def feed_changes(
    s: Session, user_id: int, limit: int, tracking_ids: list[int] | None = None
) -> list[Row[Any]]:
    """(snapshot id, previous snapshot id, page id, URL, title, view key, taken at) of
    the confirmed changes of the views ``user_id`` tracks since they track them (only
    through the trackings ``tracking_ids``, when given), newest first."""
    only = Tracking.id.in_(tracking_ids) if tracking_ids is not None else true()
    older = aliased(Snapshot)
    previous = (
        select(func.max(older.id))
        .where(
            older.page_id == Snapshot.page_id,
            older.selector == Snapshot.selector,
            older.id < Snapshot.id,
        )
        .correlate(Snapshot)
        .scalar_subquery()
    )
    return list(
        s.execute(
            select(Snapshot.id, previous, Page.id, Page.url, Page.title, Snapshot.selector)
            .add_columns(Snapshot.taken_at)
            .join(Page, Page.id == Snapshot.page_id)
            .join(Tracking, Tracking.page_id == Page.id)
            .where(
                Tracking.user_id == user_id,
                Snapshot.kind == "change",
                Snapshot.selector == func.coalesce(Tracking.selector, WHOLE_PAGE),
                Snapshot.taken_at >= Tracking.since,
                only,
            )
            .order_by(Snapshot.id.desc())
            .limit(limit)
        ).all()
    )
