"""Per-user quotas: most trackings, most URLs submitted per day, largest batch.

Defaults come from ``JODL_USER_*`` settings; an operator gives one user other
limits (``jodl users quota EMAIL ...``, ``POST /api/admin/quota``), kept in
:class:`UserQuota`, one row per user with an override (NULL: the default; 0: no
limit). A request over a limit is refused whole with :class:`QuotaExceeded`
before anything is written: no tracking added, no URL of the batch queued.

The trackings quota is checked here (tracking is the page checker's); the URLs
per day and the batch size are checked by the web UI, which owns the submitted
batches (``web/quota.py``), with the limits :func:`limits_of` gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jodl.exceptions import JodlError
from jodl.settings.config import read_values
from jodl.settings.options import Option, register_options

from ..models import Tracking, User, UserQuota
from ..settings import AppOption

#: Pages one user may track by default (each is fetched every cycle).
DEFAULT_MAX_TRACKINGS = 500
#: URLs one user may submit in 24 hours by default (each is a fetch by an agent).
DEFAULT_URLS_PER_DAY = 5000
#: URLs in one submission by default (never more than JODL_WEB_BATCH_MAX).
DEFAULT_MAX_BATCH = 100

OPTIONS: tuple[Option, ...] = (
    AppOption(
        "JODL_USER_MAX_TRACKINGS",
        str(DEFAULT_MAX_TRACKINGS),
        "int0",
        "Pages one user may track (0: no limit); an operator may set another limit per user",
        "web",
    ),
    AppOption(
        "JODL_USER_URLS_PER_DAY",
        str(DEFAULT_URLS_PER_DAY),
        "int0",
        "URLs one user may submit in any 24 hours (0: no limit); per user: jodl users quota",
        "web",
    ),
    AppOption(
        "JODL_USER_MAX_BATCH",
        str(DEFAULT_MAX_BATCH),
        "int0",
        "URLs one user may submit at once (0: no limit below JODL_WEB_BATCH_MAX, which "
        "bounds every submission); per user: jodl users quota",
        "web",
    ),
)
register_options(OPTIONS)

#: The quotas, as named in errors, metrics, the CLI and the API.
QUOTAS = ("trackings", "urls_per_day", "batch")


@dataclass(frozen=True)
class Limits:
    """A user's limits in effect (0: none)."""

    trackings: int = DEFAULT_MAX_TRACKINGS
    urls_per_day: int = DEFAULT_URLS_PER_DAY
    batch: int = DEFAULT_MAX_BATCH

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Limits:
        """The defaults (``JODL_USER_*``)."""
        values = read_values(OPTIONS, env)
        return cls(
            trackings=values["user_max_trackings"],
            urls_per_day=values["user_urls_per_day"],
            batch=values["user_max_batch"],
        )


class QuotaExceeded(JodlError):
    """A request over one of a user's quotas; nothing of it was done."""

    def __init__(self, quota: str, message: str) -> None:
        super().__init__(message)
        #: Which quota (one of :data:`QUOTAS`), for metrics.
        self.quota = quota


def limits_of(session: Session, user_id: int, defaults: Limits | None = None) -> Limits:
    """The limits in effect for a user: the operator's override, else the defaults."""
    defaults = defaults or Limits.from_env()
    row = session.get(UserQuota, user_id)
    if row is None:
        return defaults
    return Limits(
        **{
            f.name: getattr(defaults, f.name)
            if getattr(row, f.name) is None
            else getattr(row, f.name)
            for f in fields(Limits)
        }
    )


def trackings_count(session: Session, user_id: int) -> int:
    """How many trackings the user has (each view of a page counts)."""
    return session.scalar(select(func.count()).where(Tracking.user_id == user_id)) or 0


def check_tracking(
    session: Session, user: User, page_id: int | None, view: str | None = None
) -> None:
    """QuotaExceeded when ``user`` may not track one page (or view of a page) more
    (``page_id`` None: a new page; tracking a page again through a view the user
    already has changes nothing and is always allowed; each view counts)."""
    most = limits_of(session, user.id).trackings
    if not most:
        return
    if page_id is not None:
        already = session.scalar(
            select(Tracking.id).where(
                Tracking.user_id == user.id,
                Tracking.page_id == page_id,
                func.coalesce(Tracking.selector, "") == (view or ""),
            )
        )
        if already is not None:
            return
    count = trackings_count(session, user.id)
    if count >= most:
        raise QuotaExceeded(
            "trackings",
            f"{user.email} already tracks {count} pages, the most allowed ({most}); "
            "stop tracking one first, or ask an operator for a larger quota",
        )


def set_quota(session: Session, user: User, **limits: int | None) -> UserQuota:
    """Set some of a user's limits (None: back to the default; 0: no limit)."""
    for name, value in limits.items():
        if name not in QUOTAS:
            raise JodlError(f"no quota {name!r}; quotas: {', '.join(QUOTAS)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise JodlError(f"{name}: a whole number >= 0")
        if value is not None and value < 0:
            raise JodlError(f"{name}: a whole number >= 0, got {value}")
    row = session.get(UserQuota, user.id)
    if row is None:
        row = UserQuota(user_id=user.id)
        session.add(row)
    for name, value in limits.items():
        setattr(row, name, value)
    session.flush()
    return row


__all__ = [
    "Limits",
    "QUOTAS",
    "QuotaExceeded",
    "UserQuota",
    "check_tracking",
    "limits_of",
    "set_quota",
    "trackings_count",
]
