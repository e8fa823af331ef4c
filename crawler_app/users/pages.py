"""Users, pages and trackings: the operations behind ``jodl users``/``track``/``untrack``.

Every function works inside the caller's SQLAlchemy session and transaction, so
the CLI and the web UI can combine them and commit once. A URL is normalised
(and checked for syntax by the SSRF guard) before it is stored; the same URL
tracked by any number of users is one :class:`~crawler_app.models.Page` with one
``check_page`` job keyed by that normalised URL.

This module is the gateway of the users, pages and trackings tables: the rest of the
page checker (and, through ``crawler_app``'s public names, the web UI) changes them by
its named functions and builds no SQL on them (tests/test_layers.py).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Row, bindparam, func, insert, select, true, update
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from jodl.exceptions import JodlError
from jodl.log import JobLog, JobState, utcnow

from ..checking.due import Clock, Schedule
from ..fetching.filters import FilterError, ViewSpec
from ..fetching.guard import FetchRefused, parse_url
from ..fetching.reach import Reach
from ..models import URL_LENGTH, WHOLE_PAGE, Page, PageView, Tracking, User
from ..settings import AppSettings
from .quota import check_tracking

#: Family of the jobs that fetch pages.
CHECK_FAMILY = "check_page"
#: How check_page jobs are placed: every page of a host on one agent, so the host's
#: politeness limits (requests in flight, spacing, Retry-After, robots.txt) hold
#: across the cluster, not per agent.
CHECK_STRATEGY = ("affinity", {"by": "host"})
#: Family of the jobs that send digests.
NOTIFY_FAMILY = "notify"

# One mailbox: no characters that separate or group addresses in a header
# ("a@x.org,postmaster" would be two recipients).
_ATOM = r"[^@\s,;:<>()\[\]\\\"]+"
_EMAIL = re.compile(rf"^{_ATOM}@{_ATOM}\.{_ATOM}$|^{_ATOM}@localhost$")


class PageError(JodlError):
    """A user, URL or filter the page checker cannot accept (one-line message)."""


def normalise_url(url: str) -> str:
    """The normalised form of ``url`` (lower-case scheme and host, no default port, no
    fragment); :class:`PageError` if the guard refuses its syntax (``file:``, credentials,
    odd IPv4 forms, backslashes...). No DNS lookup: addresses are checked at every fetch."""
    try:
        normal = parse_url(url.strip()).url
    except FetchRefused as exc:
        raise PageError(f"{url!r} is refused: {exc.message}") from None
    if len(normal) > URL_LENGTH:
        raise PageError(f"URLs longer than {URL_LENGTH} characters are refused")
    return normal


def check_selector(selector: str | None) -> str | None:
    """A selector (CSS, XPath, JSONPath) ready to use (None for the whole page) or
    :class:`PageError` naming it."""
    return check_view(selector=selector).selector


def check_view(**filters: Any) -> ViewSpec:
    """A view's filters checked (:meth:`ViewSpec.build`'s arguments), or :class:`PageError`
    naming the first bad expression."""
    try:
        return ViewSpec.build(**filters)
    except FilterError as exc:
        raise PageError(str(exc)) from None


#: Tags per tracking at most, and characters per tag.
MAX_TAGS = 10
TAG_LENGTH = 40
_TAG = re.compile(rf"^[\w.-]{{1,{TAG_LENGTH}}}$", re.ASCII)


def check_tags(tags: Iterable[str]) -> list[str]:
    """Tags ready to store: lower-cased, stripped, without repeats, in the order given;
    :class:`PageError` naming a bad one (letters, digits, ``_ . -``; at most
    :data:`TAG_LENGTH` characters, :data:`MAX_TAGS` tags)."""
    out: list[str] = []
    for raw in tags:
        tag = raw.strip().lower() if isinstance(raw, str) else raw
        if not isinstance(tag, str) or not _TAG.match(tag):
            raise PageError(
                f"tag {raw!r}: ASCII letters, digits, _ . - only, 1 to {TAG_LENGTH} characters"
            )
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise PageError(f"at most {MAX_TAGS} tags per tracking")
    return out


def matches(
    query: str, url: str, title: str | None, tags: Iterable[str], name: str | None = None
) -> bool:
    """True when every word of ``query`` is in the URL, the title, the tracking's name or
    a tag (any case)."""
    haystack = " ".join([url, title or "", name or "", *tags]).lower()
    return all(word in haystack for word in query.lower().split())


def normalise_email(email: str) -> str:
    """Lower-cased, stripped address; :class:`PageError` if it does not look like one."""
    email = email.strip().lower()
    if len(email) > 320 or not _EMAIL.match(email):
        raise PageError(f"not an e-mail address: {email!r}")
    return email


# -- users -------------------------------------------------------------------------------------


def add_user(session: Session, email: str, password: str | None = None) -> User:
    """Create a user; :class:`PageError` if the address is taken or malformed.

    The password is stored only as a salted hash (werkzeug's scrypt); without a
    password the user cannot log in to the web UI but still gets e-mails.
    """
    email = normalise_email(email)
    if session.scalar(select(User.id).where(User.email == email)) is not None:
        raise PageError(f"user {email} already exists")
    user = User(
        email=email,
        password_hash=generate_password_hash(password) if password else None,
        created_at=utcnow(),
    )
    session.add(user)
    session.flush()
    return user


def get_user(session: Session, email: str) -> User:
    """The user with this address; :class:`PageError` if there is none."""
    email = normalise_email(email)
    user = session.scalar(select(User).where(User.email == email))
    if user is None:
        raise PageError(f"no user {email}; add one with: jodl users add {email}")
    return user


def set_password(user: User, password: str) -> None:
    """Replace the user's password (hash only)."""
    user.password_hash = generate_password_hash(password)
    # The web UI's sessions and API tokens opened under the old password end.
    user.session_version = (user.session_version or 0) + 1


def check_password(user: User, password: str) -> bool:
    """True when ``password`` is the user's."""
    return bool(user.password_hash) and check_password_hash(user.password_hash or "", password)


def remove_user(session: Session, email: str) -> None:
    """Delete a user and their trackings; pages nobody tracks any more stop being checked."""
    user = get_user(session, email)
    page_ids = list(session.scalars(select(Tracking.page_id).where(Tracking.user_id == user.id)))
    session.delete(user)
    session.flush()
    sync_jobs(session, page_ids)


# -- tracking ----------------------------------------------------------------------------------


def track(
    session: Session,
    email: str,
    url: str,
    selector: str | None = None,
    period: int | None = None,
    browser: bool | None = None,
    view: ViewSpec | None = None,
    tags: Iterable[str] | None = None,
    schedule: Schedule | None = None,
) -> Tracking:
    """``email`` tracks ``url`` through a view: ``view`` (filters and trigger,
    :mod:`crawler_app.fetching.filters`), or only the part ``selector`` picks, or the whole page.

    A user may track one page through several views: tracking it again through a
    view they have changes only ``browser`` (when given); through another view it
    adds a tracking. The page's ``check_page`` job is created (or revived) at once,
    and fetches the page once for all its views. ``period`` (checked every N-th
    cycle) applies to the page, hence to all its trackers. ``browser``: the page is
    rendered in a browser, for all its trackers (see :func:`_render_mode`). ``tags``
    (when given) replace the tracking's tags (:func:`check_tags`); ``schedule`` (when
    given, from :func:`crawler_app.checking.due.check_schedule_of`) replaces its schedule.
    Queue its first check with :func:`crawler_app.checking.baselines.request` once committed.
    """
    user = get_user(session, email)
    normal = normalise_url(url)
    if view is None:
        view = check_view(selector=selector)
    key = view.key
    if period is not None and period < 1:
        raise PageError("the period is a whole number of cycles, at least 1")
    labels = check_tags(tags) if tags is not None else None
    page = session.scalar(select(Page).where(Page.url == normal))
    check_tracking(session, user, page.id if page is not None else None, key)
    if page is None:
        page = Page(url=normal, period=period or 1, created_at=utcnow())
        session.add(page)
        session.flush()
    elif period is not None:
        page.period = period
    tracking = session.scalar(
        select(Tracking).where(
            Tracking.user_id == user.id, Tracking.page_id == page.id, _view_is(key)
        )
    )
    if tracking is None:
        tracking = Tracking(
            user_id=user.id,
            page_id=page.id,
            selector=key,
            since=utcnow(),
            browser=bool(browser),
            tags=labels or [],
        )
        session.add(tracking)
    else:
        if browser is not None:
            tracking.browser = browser
        if labels is not None:
            tracking.tags = labels
    if schedule is not None:
        tracking.every, tracking.cron = schedule.every, schedule.cron
    session.flush()
    sync_jobs(session, [page.id])
    _render_mode(session, page.id)
    return tracking


def _render_mode(session: Session, page_id: int) -> None:
    """Render the page in a browser when any of its trackers asks for it.

    A page is fetched once for all its trackers, so the choice is the page's. When
    it changes, the views' text changes with it (scripts add or drop text): their
    baselines go, and the next check takes new ones instead of alerting everyone.
    """
    page = session.get(Page, page_id)
    if page is None:
        return
    wanted = bool(
        session.scalar(
            select(Tracking.id).where(Tracking.page_id == page_id, Tracking.browser.is_(True))
        )
    )
    if wanted == page.browser:
        return
    page.browser = wanted
    page.etag = page.last_modified = None
    page.refused_requests = None
    session.execute(
        update(PageView)
        .where(PageView.page_id == page_id)
        .values(fingerprint=None, model=None, recent=[])
    )
    session.flush()


def _view_is(key: str) -> Any:
    """The trackings through the view ``key`` (a whole-page tracking kept from before
    views had keys has NULL)."""
    if key == WHOLE_PAGE:
        return (Tracking.selector == WHOLE_PAGE) | Tracking.selector.is_(None)
    return Tracking.selector == key


def untrack(
    session: Session,
    email: str,
    url: str,
    view: ViewSpec | None = None,
    tracking_id: int | None = None,
) -> bool:
    """Stop ``email`` tracking ``url`` (through ``view``, or the tracking
    ``tracking_id``, only; else through all their views); False if they did not.

    A page nobody tracks keeps its history but its job is deleted (no more fetches).
    """
    user = get_user(session, email)
    normal = normalise_url(url)
    page = session.scalar(select(Page).where(Page.url == normal))
    if page is None:
        return False
    query = select(Tracking).where(Tracking.user_id == user.id, Tracking.page_id == page.id)
    if view is not None:
        query = query.where(_view_is(view.key))
    if tracking_id is not None:
        query = query.where(Tracking.id == tracking_id)
    trackings = list(session.scalars(query))
    if not trackings:
        return False
    for tracking in trackings:
        session.delete(tracking)
    session.flush()
    sync_jobs(session, [page.id])
    _render_mode(session, page.id)
    return True


def _trackings_of_page(
    session: Session, email: str, url: str, tracking_id: int | None
) -> tuple[Page, list[Tracking]]:
    """The page of ``url`` and ``email``'s trackings of it (only ``tracking_id``, if
    given); :class:`PageError` if they track no such page."""
    user = get_user(session, email)
    normal = normalise_url(url)
    page = session.scalar(select(Page).where(Page.url == normal))
    query = select(Tracking).where(
        Tracking.user_id == user.id, Tracking.page_id == (page.id if page is not None else -1)
    )
    if tracking_id is not None:
        query = query.where(Tracking.id == tracking_id)
    trackings = list(session.scalars(query))
    if page is None or not trackings:
        raise PageError(f"{user.email} does not track {normal}")
    return page, trackings


def set_paused(
    session: Session, email: str, url: str, paused: bool, tracking_id: int | None = None
) -> int:
    """Pause (or resume) ``email``'s trackings of ``url`` (only ``tracking_id``, if
    given); the number of trackings that changed. :class:`PageError` if they track
    no such page.

    A paused tracking keeps its history and views; it gets no digest, and a page
    whose trackings are all paused is not fetched (its job is retired and comes
    back when one of them resumes).
    """
    page, trackings = _trackings_of_page(session, email, url, tracking_id)
    changed = [t for t in trackings if t.paused != paused]
    for tracking in changed:
        tracking.paused = paused
    session.flush()
    sync_jobs(session, [page.id])
    return len(changed)


def set_schedule(
    session: Session, email: str, url: str, schedule: Schedule, tracking_id: int | None = None
) -> int:
    """Give ``email``'s trackings of ``url`` (only ``tracking_id``, if given) this
    schedule; how many there are. The page's due time follows at once."""
    page, trackings = _trackings_of_page(session, email, url, tracking_id)
    for tracking in trackings:
        tracking.every, tracking.cron = schedule.every, schedule.cron
    session.flush()
    sync_jobs(session, [page.id])
    return len(trackings)


#: What a tracker is told about a page that builds its text with scripts.
SCRIPT_PAGE_NOTE = "this page builds its text with JavaScript: turn on the browser"


def page_note(page: Page) -> str | None:
    """A line for the page's trackers about how it is read, or None.

    A page fetched without the browser whose text is (nearly) all built by its
    scripts shows its trackers nothing; a rendered page may have had requests refused.
    """
    if page.script_page and not page.browser:
        return SCRIPT_PAGE_NOTE
    if page.browser and page.refused_requests:
        return f"the browser refused {page.refused_requests} request(s) the page made"
    return None


def page_ids(session: Session, urls: Iterable[str]) -> list[int]:
    """Ids of the pages of these normalised URLs."""
    return list(session.scalars(select(Page.id).where(Page.url.in_(list(urls)))))


def trackings_of(session: Session, email: str) -> list[tuple[Tracking, Page]]:
    """A user's trackings with their pages, by URL (a page's views in the order tracked)."""
    user = get_user(session, email)
    rows = session.execute(
        select(Tracking, Page)
        .join(Page, Page.id == Tracking.page_id)
        .where(Tracking.user_id == user.id)
        .order_by(Page.url, Tracking.id)
    )
    return [(t, p) for t, p in rows.tuples()]


def users_with_counts(session: Session) -> list[tuple[int, str, int]]:
    """(id, address, trackings) of every user, by address."""
    rows = session.execute(
        select(User.id, User.email, func.count(Tracking.id))
        .outerjoin(Tracking, Tracking.user_id == User.id)
        .group_by(User.id, User.email)
        .order_by(User.email)
    ).all()
    return [(user_id, email, count) for user_id, email, count in rows]


def trackers_count(session: Session, page_id: int) -> int | None:
    """How many trackings the page has (each view counts)."""
    return session.scalar(select(func.count()).where(Tracking.page_id == page_id))


def tracked_rows(session: Session, email: str | None = None) -> list[Row[Any]]:
    """(address, page, view key, the view's problem, paused, tags, every, cron) of each
    tracking (only ``email``'s when given), by URL, address and tracking."""
    query = (
        select(
            User.email,
            Page,
            Tracking.selector,
            PageView.problem,
            Tracking.paused,
            Tracking.tags,
            Tracking.every,
            Tracking.cron,
        )
        .join(Tracking, Tracking.user_id == User.id)
        .join(Page, Page.id == Tracking.page_id)
        .outerjoin(
            PageView,
            (PageView.page_id == Page.id)
            & (PageView.selector == func.coalesce(Tracking.selector, "")),
        )
        .order_by(Page.url, User.email, Tracking.id)
    )
    if email:
        query = query.where(User.email == normalise_email(email))
    return list(session.execute(query).all())


# -- pages and their check_page jobs -------------------------------------------------------------


def check_payload(
    url: str, browser: bool, views: dict[str, Any], reach: Reach = Reach.PUBLIC
) -> dict[str, Any]:
    """The payload of a ``check_page`` job (see :class:`crawler_app.checking.families.CheckPage`);
    ``reach``: whether its fetches may use the allowlist (:mod:`crawler_app.fetching.reach`)."""
    payload: dict[str, Any] = {"url": url, "views": views}
    if browser:
        payload["browser"] = True
    return reach.mark(payload)


def family_id(session: Session, name: str) -> int:
    """Id of the JODL family ``name``, created on first use."""
    # A check may run twice harmlessly; a digest may not (its claim guards it, but a
    # backup copy would only ever be refused): no backups, no timeouts for notify.
    placement: dict[str, Any] = {}
    if name == CHECK_FAMILY:  # others keep the library's default strategy
        placement = dict(zip(("strategy", "strategy_params"), CHECK_STRATEGY, strict=True))
    return JobLog.family_id(
        session.connection(), name, idempotent=name != NOTIFY_FAMILY, **placement
    )


def sync_jobs(
    session: Session,
    page_ids: Iterable[int] | None = None,
    settings: AppSettings | None = None,
    now: dt.datetime | None = None,
    every_page: bool = False,
) -> int:
    """Give every tracked page an idle ``check_page`` job and delete the untracked ones' jobs
    (a page whose trackings are all paused counts as untracked).

    ``page_ids`` limits the work to those pages (None: all pages). Each live job's
    due time is the earliest next due among the page's active trackings at ``now``
    (:mod:`crawler_app.checking.due`; ``settings`` give the default schedule, by default the
    environment's); ``every_page``: none, so the next run takes every page. Also
    gives each page a view per view key its trackers use. A handful of statements
    whatever the number of pages. Returns the number of pages with a live job.
    """
    ids = None if page_ids is None else list(page_ids)
    if ids is not None and not ids:
        return 0

    def only(column: Any) -> Any:
        return column.in_(ids) if ids is not None else true()

    conn = session.connection()
    page_rows = session.execute(
        select(
            Page.id, Page.url, Page.job_id, Page.period, Page.slot_at, Page.last_checked_at
        ).where(only(Page.id))
    ).all()
    if not page_rows:
        return 0  # nothing tracked yet: no check_page family made for nothing
    fid = family_id(session, CHECK_FAMILY)
    lines = JobLog.lines(conn, [r.job_id for r in page_rows if r.job_id is not None])
    pages = []
    for page_id, url, job_id, period, _, _ in page_rows:
        line = lines.get(job_id) if job_id is not None else None
        state, every = (line.state, line.every_n_cycles) if line else (None, None)
        pages.append((page_id, url, job_id, period, state, every))
    selectors: dict[int, set[str]] = {}
    active: dict[int, list[Schedule]] = {}  # pages with a tracking not paused: its schedules
    for page_id, selector, paused, every, cron in session.execute(
        select(
            Tracking.page_id, Tracking.selector, Tracking.paused, Tracking.every, Tracking.cron
        ).where(only(Tracking.page_id))
    ):
        selectors.setdefault(page_id, set()).add(selector or WHOLE_PAGE)
        if not paused:
            active.setdefault(page_id, []).append(Schedule(every, cron))
    views = set(
        session.execute(select(PageView.page_id, PageView.selector).where(only(PageView.page_id)))
        .tuples()
        .all()
    )
    missing: dict[str, tuple[int, int]] = {}  # url -> (page id, period)
    revive: list[dict[str, Any]] = []
    delete: list[int] = []
    for page_id, url, job_id, period, state, every in pages:
        # A page whose trackings are all paused is not fetched: its job goes as if
        # nobody tracked it (views and history stay), and comes back on resume.
        if page_id in active:
            if job_id is None or state is None:
                missing[url] = (page_id, period)
            elif state != JobState.IDLE or every != period:
                revive.append({"jid": job_id, "every": period})
        elif job_id is not None and state not in (None, JobState.DELETED):
            delete.append(job_id)
    if missing:
        # A job of that key may exist without the page pointing at it (added elsewhere).
        existing = JobLog.ids_by_key(conn, fid, list(missing))
        inserted = set(
            JobLog.add_idle(
                conn,
                fid,
                (
                    (url, json.dumps({"url": url}), period)
                    for url, (_, period) in missing.items()
                    if url not in existing
                ),
            )
        )
        existing = JobLog.ids_by_key(conn, fid, list(missing))
        session.execute(
            update(Page.__table__).where(Page.__table__.c.id == bindparam("pid")),
            [{"pid": pid, "job_id": existing[url]} for url, (pid, _) in missing.items()],
        )
        revive.extend(
            {"jid": existing[url], "every": period}
            for url, (_, period) in missing.items()
            if url not in inserted
        )
    # Tracked again (or dead after repeated failures): back into the cycles.
    JobLog.revive(conn, [(r["jid"], r["every"]) for r in revive])
    JobLog.delete(conn, delete)
    # One fetch per due time however many track the page: its one job is due at the
    # earliest of its active trackings' next times, counted from the cycle that last
    # checked it (a baseline check, for a page no cycle checked yet).
    clock = Clock(settings or AppSettings.from_env())
    now = now or utcnow()
    JobLog.set_due(
        conn,
        fid,
        {
            url: None if every_page else clock.page_due(active[page_id], slot or checked, now)
            for page_id, url, _, _, slot, checked in page_rows
            if page_id in active
        },
    )
    new_views = [
        {"page_id": page_id, "selector": sel, "recent": []}
        for page_id, sels in selectors.items()
        for sel in sorted(sels)
        if (page_id, sel) not in views
    ]
    if new_views:
        session.execute(insert(PageView), new_views)
    session.expire_all()
    return len(active)
