"""The fetches' SQL: the statement :mod:`crawler_app.fetching.reach` runs on the page
checker's tables, as a named function (reach builds none of its own).

It works in the caller's session and transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sqlalchemy import false, or_, select, true
from sqlalchemy.orm import Session

from ..models import Tracking, User


def pages_tracked_by_admitted(
    session: Session,
    *,
    emails: Collection[str],
    operators: bool,
    everyone: bool,
    page_ids: Iterable[int] | None = None,
) -> set[int]:
    """Ids of the pages (of ``page_ids``; None: all) tracked by a user admitted:
    every user with ``everyone``, else one whose address is in ``emails`` or, with
    ``operators``, one with the admin role."""
    admitted = (
        true()
        if everyone
        else or_(
            User.email.in_(sorted(emails)) if emails else false(),
            User.is_admin.is_(True) if operators else false(),
        )
    )
    query = (
        select(Tracking.page_id).join(User, User.id == Tracking.user_id).where(admitted).distinct()
    )
    if page_ids is not None:
        query = query.where(Tracking.page_id.in_(list(page_ids)))
    return set(session.scalars(query))
