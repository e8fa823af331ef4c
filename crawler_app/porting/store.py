"""Import trackings into a user's account, all or nothing, and read them out for export.

An import is checked whole before anything is written (every entry, then the
user's trackings quota against the trackings it adds), then written in one
savepoint of the caller's transaction: an error part-way leaves nothing. A
tracking the user already has (the same page through the same filters) is
updated to what the file says (tags, pause, browser, period, where the file says
them) rather than duplicated, so importing a file twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..checking.due import Schedule
from ..fetching.filters import FilterError, ViewSpec
from ..models import WHOLE_PAGE, Page, Tracking
from ..users.pages import get_user, sync_jobs, track, trackings_of
from ..users.quota import QuotaExceeded, limits_of
from .spec import Exported, Parsed, TrackingSpec


@dataclass
class ImportReport:
    """What an import did; ``baseline_pages``: pages of its active trackings, to queue
    the first check of those without a baseline once committed
    (:func:`crawler_app.checking.baselines.request`)."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    notes: list[str] = field(default_factory=list)
    baseline_pages: list[int] = field(default_factory=list)

    def summary(self) -> str:
        return f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged"

    def as_dict(self) -> dict[str, object]:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "notes": list(self.notes),
        }


def _existing(s: Session, user_id: int) -> dict[tuple[str, str], Tracking]:
    query = select(Page.url, Tracking).join(Page, Page.id == Tracking.page_id)
    rows = s.execute(query.where(Tracking.user_id == user_id)).tuples()
    return {(url, t.selector or WHOLE_PAGE): t for url, t in rows}


def _check_quota(s: Session, user_id: int, email: str, new: int) -> None:
    most = limits_of(s, user_id).trackings
    count = s.scalar(select(func.count()).where(Tracking.user_id == user_id)) or 0
    if most and new and count + new > most:
        raise QuotaExceeded(
            "trackings",
            f"nothing imported: {email} tracks {count} pages and the file adds {new}, "
            f"more than the {most} allowed; remove some first, or ask an operator for a "
            "larger quota",
        )


def _state(t: Tracking, page: Page) -> tuple[object, ...]:
    return (tuple(t.tags or ()), bool(t.paused), bool(t.browser), page.period, t.name,
            t.every, t.cron)  # fmt: skip


def import_trackings(s: Session, email: str, parsed: Parsed) -> ImportReport:
    """Track everything ``parsed`` asks for, for ``email``, in one savepoint; raises
    :class:`~crawler_app.porting.spec.ImportRefused` (problems) or
    :class:`~crawler_app.users.quota.QuotaExceeded` before writing anything."""
    specs = parsed.checked().specs
    user = get_user(s, email)
    have = _existing(s, user.id)
    new = [spec for spec in specs if (spec.url, spec.view.key) not in have]
    _check_quota(s, user.id, user.email, len(new))
    report = ImportReport(notes=list(parsed.notes))
    with s.begin_nested():
        touched: list[int] = []
        for spec in specs:
            before = have.get((spec.url, spec.view.key))
            page = s.get(Page, before.page_id) if before is not None else None
            state = _state(before, page) if before is not None and page is not None else None
            tracking = _write(s, user.email, spec)
            page = s.get(Page, tracking.page_id)
            assert page is not None
            touched.append(page.id)
            if not tracking.paused:  # queued only where a view has no baseline yet
                report.baseline_pages.append(page.id)
            if state is None:
                report.added += 1
            elif state != _state(tracking, page):
                report.updated += 1
            else:
                report.unchanged += 1
        sync_jobs(s, touched)  # pauses: a page all of whose trackings are paused is not fetched
    return report


def _write(s: Session, email: str, spec: TrackingSpec) -> Tracking:
    tracking = track(
        s,
        email,
        spec.url,
        period=spec.period,
        browser=spec.browser,
        view=spec.view,
        tags=spec.tags,
        schedule=spec.schedule,
    )
    if spec.paused is not None:
        tracking.paused = spec.paused
    if spec.name is not None:
        tracking.name = spec.name
    return tracking


def exported(s: Session, email: str) -> list[Exported]:
    """The user's trackings as written out, by URL (a page's views in the order tracked)."""
    items = []
    for tracking, page in trackings_of(s, email):
        try:
            view = ViewSpec.parse(tracking.selector)
        except FilterError:  # stored before a check this JODL makes: kept as it was
            view = ViewSpec(selector=tracking.selector or None)
        items.append(
            Exported(
                url=page.url,
                title=page.title,
                view=view,
                tags=tuple(tracking.tags or ()),
                paused=bool(tracking.paused),
                browser=bool(tracking.browser),
                period=page.period,
                schedule=Schedule(tracking.every, tracking.cron),
                name=tracking.name,
            )
        )
    return items
