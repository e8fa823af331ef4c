"""The per-user quotas of submissions (URLs per day, largest batch) and their refusals.

The limits are the page checker's (:mod:`crawler_app.users.quota`: defaults, operators'
overrides); the submitted batches are the web UI's, so they are counted here. A
submission over a quota is refused whole, before a URL is queued or a batch
written: 403 with ``{"error": "quota_exceeded", ...}`` in the API, a message in
the HTML views, and ``jodl_web_quota_refused_total{quota=...}`` counts it.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.orm import sessionmaker
from werkzeug.exceptions import BadRequest, Forbidden, NotFound

from crawler_app import (
    QUOTAS,
    Limits,
    QuotaExceeded,
    limits_of,
    normalise_email,
    set_quota,
)
from jodl.exceptions import JodlError
from jodl.log import utcnow

from . import queries
from .schemas import QuotaChange

#: The window of the "URLs per day" quota: any 24 hours, not the calendar day (no
#: burst of twice the quota around midnight).
DAY = dt.timedelta(days=1)


class QuotaRefused(Forbidden):
    """A request over a user quota, as an HTTP answer (403, ``quota_exceeded``)."""

    name = "Quota exceeded"


_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


@contextmanager
def one_at_a_time(user_id: int) -> Iterator[None]:
    """Hold one user's submissions in this process one at a time: the count of the
    last 24 hours and the batch it admits are then never interleaved with another
    of the user's submissions. (Web processes of one site do not share it: with
    several, two submissions at the same instant can still both pass the count.)"""
    with _LOCKS_LOCK:
        lock = _LOCKS.setdefault(user_id, threading.Lock())
    with lock:
        yield


def urls_since(sessions: sessionmaker[Any], user_id: int, since: dt.datetime) -> int:
    """URLs ``user_id`` submitted since ``since`` (every batch's size)."""
    with sessions() as s:
        return queries.urls_submitted_since(s, user_id, since)


def check_submission(
    sessions: sessionmaker[Any], user_id: int, count: int, now: dt.datetime
) -> Limits:
    """QuotaExceeded when ``count`` URLs more break the user's batch or daily quota."""
    with sessions() as s:
        limits = limits_of(s, user_id)
    if limits.batch and count > limits.batch:
        raise QuotaExceeded(
            "batch",
            f"{count} URLs given; your quota is {limits.batch} per submission: split them",
        )
    if limits.urls_per_day:
        used = urls_since(sessions, user_id, now - DAY)
        if used + count > limits.urls_per_day:
            left = max(0, limits.urls_per_day - used)
            raise QuotaExceeded(
                "urls_per_day",
                f"{count} URLs given but only {left} more of your {limits.urls_per_day} "
                "per 24 hours are left; nothing was queued: try again later or submit fewer",
            )
    return limits


def refused(metrics: Any, exc: QuotaExceeded) -> QuotaRefused:
    """Count a refusal; the HTTP error to raise."""
    metrics.inc("jodl_web_quota_refused_total", quota=exc.quota)
    return QuotaRefused(str(exc))


def usage(sessions: sessionmaker[Any], user_id: int) -> dict[str, Any]:
    """A user's limits in effect (0: none) and what they used of them."""
    with sessions() as s:
        limits = limits_of(s, user_id)
        tracked = queries.count_trackings(s, user_id)
    return {
        "limits": {q: getattr(limits, q) for q in QUOTAS},
        "used": {
            "trackings": int(tracked),
            "urls_per_day": urls_since(sessions, user_id, utcnow() - DAY),
        },
    }


def set_user_quota(sessions: sessionmaker[Any], change: QuotaChange) -> dict[str, Any]:
    """An operator sets some quotas of the user ``change.email`` (null: the default,
    0: no limit; those left out: unchanged); the user's limits and usage after.
    Nothing changes on bad input."""
    email = change.email
    if not email.strip():
        raise BadRequest("email: the user's e-mail address")
    changes = change.model_dump(exclude_unset=True, include=set(QUOTAS))
    try:
        address = normalise_email(email)
    except JodlError:
        raise NotFound("no such user") from None
    with sessions.begin() as s:
        user = queries.user_by_email(s, address)
        if user is None:
            raise NotFound("no such user")
        set_quota(s, user, **changes)
        user_id = user.id
    return {"email": address, **usage(sessions, user_id)}


__all__ = [
    "QuotaRefused",
    "check_submission",
    "one_at_a_time",
    "refused",
    "set_user_quota",
    "urls_since",
    "usage",
]
