"""Tracked pages of the logged-in user: add (through a view: selector, line filters,
trigger), tag, search, pause and resume, remove, history, diffs.

A user may track one page through several views; each is a tracking of its own
(``tracking`` in the list). The routes of a page take ``?tracking=ID`` to pick one
of the user's views of it (default: the first).

The functions here are shared by the HTML views and the JSON API; they use the
page checker's own operations (track, untrack) so the web UI and the ``jodl``
commands behave the same.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from werkzeug.exceptions import BadRequest, NotFound

from crawler_app import (
    NAME_LENGTH,
    WHOLE_PAGE,
    FilterError,
    Page,
    PageError,
    QuotaExceeded,
    Schedule,
    ScheduleError,
    Snapshot,
    Tracking,
    ViewSpec,
    baselines,
    check_schedule_of,
    check_tags,
    matches,
    next_checks,
    page_note,
    set_paused,
    set_schedule,
    track,
    trackings_of,
    untrack,
)

from . import channels, queries
from .auth import CurrentUser, current_user, limit, login_required
from .diff import Piece, inline, side_by_side
from .quota import QuotaRefused, refused
from .services import IdConverter, Services, services

bp = Blueprint("tracking", __name__)

#: Snapshots listed in a page's history at most.
HISTORY_LIMIT = 200
#: Longest search of the tracked pages (``?q=``).
SEARCH_MAX = 200


def _iso(value: dt.datetime | None) -> str | None:
    """ISO text in UTC with a Z; a naive ``value`` is UTC already."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(timespec="seconds") + "Z"


def _next_checks(svc: Services, page_ids: list[int]) -> dict[int, dt.datetime]:
    """When these pages are next checked: their jobs' due times (crawler_app.checking.due)."""
    return next_checks(svc.engine, page_ids)


def list_pages(svc: Services, user: CurrentUser, query: Any = None) -> list[dict[str, Any]]:
    """The user's tracked pages with their last check and the next one the schedule makes;
    with ``query``, only those whose URL, title or tags hold each of its words."""
    if query is not None and (not isinstance(query, str) or len(query) > SEARCH_MAX):
        raise BadRequest(f"q: at most {SEARCH_MAX} characters")
    with svc.batches.sessions() as s:
        rows = trackings_of(s, user.email)
        if query and query.strip():
            rows = [(t, p) for t, p in rows if matches(query, p.url, p.title, t.tags or [], t.name)]
        problems = queries.view_problems(s, [page.id for _, page in rows])
    upcoming = _next_checks(svc, [page.id for _, page in rows])
    return [
        {
            "id": page.id,
            "tracking": tracking.id,
            "url": page.url,
            **_view_fields(tracking.selector),
            "problem": problems.get((page.id, tracking.selector or WHOLE_PAGE)),
            "since": _iso(tracking.since),
            "title": page.title,
            "last_status": page.last_status,
            "last_error": page.last_error,
            "last_checked_at": _iso(page.last_checked_at),
            "last_changed_at": _iso(page.last_changed_at),
            # A paused tracking asks for no check (the page may still be checked for others).
            "next_check_at": None if tracking.paused else _iso(upcoming.get(page.id)),
            "paused": tracking.paused,
            "name": tracking.name,
            "tags": list(tracking.tags or []),
            **_schedule_fields(tracking),
            "browser": tracking.browser,
            "rendered": page.browser,
            "script_page": page.script_page,
            "refused_requests": page.refused_requests,
            "note": page_note(page),
        }
        for tracking, page in rows
    ]


def _view_fields(key: str | None) -> dict[str, Any]:
    """A tracking's view as the list and the API show it: ``selector`` (kept for
    clients from before filters), ``filters`` and a short description."""
    try:
        spec = ViewSpec.parse(key)
    except FilterError:
        spec = ViewSpec()
    return {"selector": spec.selector, "filters": spec.as_dict(), "view": spec.describe()}


#: The fields of a view in a form or a JSON body (besides ``selector``).
FILTER_FIELDS = ("xpath", "jsonpath", "include", "exclude", "ignore", "trigger")


def view_from(data: Any) -> ViewSpec:
    """The view a form or JSON body asks for (``selector`` or ``xpath`` or ``jsonpath``;
    ``include``, ``exclude``, ``ignore``: lists or one rule per line; ``trigger``);
    :class:`BadRequest` naming the first bad expression."""
    fields: dict[str, Any] = {}
    for name in ("selector", *FILTER_FIELDS):
        value = data.get(name)
        if value is None or value == "":
            continue
        if name in ("include", "exclude", "ignore") and isinstance(value, str):
            value = value.splitlines()
        if name not in ("include", "exclude", "ignore") and not isinstance(value, str):
            raise BadRequest(f"{name}: an expression as text")
        fields[name] = value
    picked = [name for name in ("selector", "xpath", "jsonpath") if name in fields]
    if len(picked) > 1:
        raise BadRequest("give one of selector, xpath, jsonpath")
    selector = None
    if picked:
        kind = picked[0]
        value = fields.pop(kind)
        selector = value if kind == "selector" else f"{kind}:{value}"
    try:
        return ViewSpec.build(selector=selector, **fields)
    except FilterError as exc:
        raise BadRequest(str(exc)) from None


def tags_from(value: Any) -> list[str] | None:
    """Tags from a JSON list or a form's text (separated by commas or spaces); None when
    not given; :class:`BadRequest` naming a bad one."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not isinstance(value, list):
        raise BadRequest("tags: a list of words")
    try:
        return check_tags(value)
    except PageError as exc:
        raise BadRequest(f"tags: {exc}") from None


def schedule_from(data: Any, form: bool = False) -> Schedule | None:
    """The schedule a JSON body or the form asks for; None when it gives neither field.

    JSON: ``every`` in whole seconds (900: 15 minutes) or ``cron`` (five fields, local
    time); both null: the operator's default schedule. The form: ``every`` as a
    duration (15m, 2h, 1d, 1w). :class:`BadRequest` naming the field, in one line."""
    every, cron = data.get("every"), data.get("cron")
    if form:
        every, cron = every or None, cron or None
        if every is None and cron is None:
            return None
    elif "every" not in data and "cron" not in data:
        return None
    if every is not None and not form and (isinstance(every, bool) or not isinstance(every, int)):
        raise BadRequest("every: whole seconds, e.g. 900 for 15 minutes (or null)")
    if cron is not None and not isinstance(cron, str):
        raise BadRequest("cron: five cron fields as text, e.g. '*/30 * * * *' (or null)")
    try:
        return check_schedule_of(every, cron)
    except ScheduleError as exc:
        field = "cron" if str(exc).startswith("cron") else "every"
        raise BadRequest(f"{field}: {exc}") from None


def _schedule_fields(tracking: Tracking) -> dict[str, Any]:
    """A tracking's schedule as the list and the API show it."""
    schedule = Schedule(tracking.every, tracking.cron)
    return {"every": tracking.every, "cron": tracking.cron, "schedule": schedule.describe()}


def set_tracking_schedule(
    svc: Services, user: CurrentUser, page_id: int, data: Any, tracking_id: Any = None
) -> dict[str, Any]:
    """Give the user's tracking ``tracking_id`` of the page (else all their trackings of
    it) the schedule ``data`` asks for (:func:`schedule_from`)."""
    schedule = schedule_from(data)
    assert schedule is not None, "called with every or cron"
    page, _ = _tracking(svc, user, page_id, tracking_id)
    with svc.batches.sessions.begin() as s:
        set_schedule(s, user.email, page.url, schedule, _tracking_id(tracking_id))
    return {"every": schedule.every, "cron": schedule.cron, "schedule": schedule.describe()}


def add_page(
    svc: Services,
    user: CurrentUser,
    url: Any,
    data: Any,
    browser: Any = False,
    json_body: bool = False,
) -> dict[str, Any]:
    """Track ``url`` through the view ``data`` asks for (:func:`view_from`; rendered in a
    browser with ``browser``; on :func:`schedule_from`'s schedule) and queue its first
    check, which takes its baseline; :class:`BadRequest` saying why not. A JSON body
    (``json_body``) was checked by :func:`web.schemas.new_tracking_body` already."""
    if not isinstance(url, str) or not url.strip():
        raise BadRequest("url: give the address of the page")
    if not isinstance(browser, bool):
        raise BadRequest("browser: true or false")
    if len(url) > svc.settings.web_url_max:
        raise BadRequest(f"url: at most {svc.settings.web_url_max} characters")
    paused = data.get("paused", False)
    if not isinstance(paused, bool):
        raise BadRequest("paused: true or false")
    view = view_from(data)
    tags = tags_from(data.get("tags"))
    schedule = schedule_from(data, form=not json_body)
    try:
        with svc.batches.sessions.begin() as s:
            tracking = track(
                s, user.email, url, browser=browser, view=view, tags=tags, schedule=schedule
            )
            page_id = tracking.page_id
            if paused:
                set_paused(s, user.email, url, True, tracking.id)
            page = queries.page_by_id(s, page_id)
            assert page is not None
            added = {
                "id": page_id,
                "tracking": tracking.id,
                "url": page.url,
                **_view_fields(tracking.selector),
                "browser": tracking.browser,
                "paused": tracking.paused,
                "tags": list(tracking.tags or []),
                **_schedule_fields(tracking),
            }
    except QuotaExceeded as exc:
        raise refused(svc.metrics, exc) from None
    except PageError as exc:
        raise BadRequest(str(exc)) from None
    if not paused:  # a tracking added paused takes its baseline when resumed
        baselines.request(svc.queue, svc.engine, [page_id], svc.allow_users)
    return added


def _tracking_id(value: Any) -> int | None:
    if value in (None, ""):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BadRequest("tracking: the id of one of your trackings of this page") from None
    if not 1 <= number <= IdConverter.MAX:  # no row has it (and the column holds no more)
        raise NotFound("you do not track such a page")
    return number


def _tracking(
    svc: Services, user: CurrentUser, page_id: int, tracking_id: Any = None
) -> tuple[Page, Tracking]:
    """The page and the user's tracking of it (``tracking_id``, else the first one)."""
    wanted = _tracking_id(tracking_id)
    with svc.batches.sessions() as s:
        row = queries.user_tracking(s, user.id, page_id, wanted)
    if row is None:
        raise NotFound("you do not track such a page")
    return row


def check_now(svc: Services, user: CurrentUser, page_id: int) -> str:
    """Fetch a tracked page now through the on-demand queue; the batch showing the result.

    For the page's trackers and operators. The fetch bypasses the result cache;
    the page's history and digests change in the application cycles, except that a
    view without a baseline gets one now (:mod:`crawler_app.baselines`).
    """
    if user.is_admin:
        with svc.batches.sessions() as s:
            page = queries.page_by_id(s, page_id)
        if page is None:
            raise NotFound("no such page")
    else:
        page, _ = _tracking(svc, user, page_id)
    try:
        reach = svc.allow_users.reach(user.email, user.is_admin)
        batch = svc.batches.submit([page.url], user.id, refetch=True, reach=reach).id
    except QuotaExceeded as exc:
        raise refused(svc.metrics, exc) from None
    baselines.request(svc.queue, svc.engine, [page.id], svc.allow_users)
    return batch


def remove_page(svc: Services, user: CurrentUser, page_id: int, tracking_id: Any = None) -> str:
    """Stop tracking the page (through the tracking ``tracking_id`` only, if given)."""
    page, _ = _tracking(svc, user, page_id, tracking_id)
    with svc.batches.sessions.begin() as s:
        untrack(s, user.email, page.url, tracking_id=_tracking_id(tracking_id))
    # The last tracker who wanted the browser gone: the others' new baseline at once.
    baselines.request(svc.queue, svc.engine, [page.id], svc.allow_users)
    return page.url


def set_tags(
    svc: Services, user: CurrentUser, page_id: int, value: Any, tracking_id: Any = None
) -> list[str]:
    """Replace the tags of the user's tracking ``tracking_id`` of the page (default: the
    first); the tags stored."""
    tags = tags_from(value) or []
    _, tracking = _tracking(svc, user, page_id, tracking_id)
    with svc.batches.sessions.begin() as s:
        row = queries.tracking_by_id(s, tracking.id)
        assert row is not None
        row.tags = tags
    return tags


def set_name(
    svc: Services, user: CurrentUser, page_id: int, value: Any, tracking_id: Any = None
) -> str | None:
    """Name the user's tracking ``tracking_id`` of the page (default: the first; null or
    empty: its page's title is shown); the name stored."""
    if value is not None and (not isinstance(value, str) or len(value) > NAME_LENGTH):
        raise BadRequest(f"name: null or text of at most {NAME_LENGTH} characters")
    name = (value or "").strip() or None
    _, tracking = _tracking(svc, user, page_id, tracking_id)
    with svc.batches.sessions.begin() as s:
        row = queries.tracking_by_id(s, tracking.id)
        assert row is not None
        row.name = name
    return name


def pause_page(
    svc: Services, user: CurrentUser, page_id: int, paused: Any, tracking_id: Any = None
) -> dict[str, Any]:
    """Pause (``paused`` True) or resume the user's tracking ``tracking_id`` of the page
    (else all their trackings of it); the page's URL and the new state."""
    if not isinstance(paused, bool):
        raise BadRequest("paused: true or false")
    page, _ = _tracking(svc, user, page_id, tracking_id)
    with svc.batches.sessions.begin() as s:
        set_paused(s, user.email, page.url, paused, _tracking_id(tracking_id))
    if not paused:  # views that never got a baseline take one now
        baselines.request(svc.queue, svc.engine, [page.id], svc.allow_users)
    return {"id": page.id, "url": page.url, "paused": paused}


def history(
    svc: Services, user: CurrentUser, page_id: int, tracking_id: Any = None
) -> dict[str, Any]:
    """The page's snapshots (newest first) for the user's view (tracking ``tracking_id``)."""
    page, tracking = _tracking(svc, user, page_id, tracking_id)
    selector = tracking.selector or WHOLE_PAGE
    with svc.batches.sessions() as s:
        problem = queries.view_problem(s, page.id, selector)
        snaps = queries.snapshot_rows(s, page.id, selector, HISTORY_LIMIT)
    return {
        "id": page.id,
        "url": page.url,
        "title": page.title,
        "tracking": tracking.id,
        **_view_fields(tracking.selector),
        "problem": problem,
        "last_checked_at": _iso(page.last_checked_at),
        "last_status": page.last_status,
        "last_error": page.last_error,
        "next_check_at": _iso(_next_checks(svc, [page.id]).get(page.id)),
        "snapshots": [
            {
                "id": sid,
                "taken_at": _iso(taken),
                "kind": kind,
                "status": status,
                "fingerprint": fp,
                "chars": chars,
            }
            for sid, taken, kind, status, fp, chars in snaps
        ],
    }


def snapshot_pair(
    svc: Services, user: CurrentUser, page_id: int, a: Any, b: Any, tracking_id: Any = None
) -> tuple[dict[str, Any], Snapshot | None, Snapshot | None]:
    """History plus the two snapshots to compare (default: the newest two)."""
    data = history(svc, user, page_id, tracking_id)
    ids = [snap["id"] for snap in data["snapshots"]]

    def pick(value: Any, default: int | None) -> int | None:
        if value in (None, ""):
            return default
        try:
            chosen = int(value)
        except (TypeError, ValueError):
            raise BadRequest("a and b: snapshot ids of this page") from None
        if chosen not in ids:
            raise NotFound("no such snapshot of this page")
        return chosen

    new_id = pick(b, ids[0] if ids else None)
    old_id = pick(a, ids[1] if len(ids) > 1 else None)
    with svc.batches.sessions() as s:
        old = queries.snapshot_by_id(s, old_id) if old_id is not None else None
        new = queries.snapshot_by_id(s, new_id) if new_id is not None else None
        if old is not None:
            old.text  # noqa: B018 - load while the session is open
        if new is not None:
            new.text  # noqa: B018
    return data, old, new


def diff_data(
    svc: Services, user: CurrentUser, page_id: int, a: Any, b: Any, tracking_id: Any = None
) -> dict[str, Any]:
    """The inline and side-by-side diff of two snapshots, as plain data (API)."""
    _data, old, new = snapshot_pair(svc, user, page_id, a, b, tracking_id)
    if old is None or new is None:
        return {"a": None, "b": None, "inline": [], "side_by_side": []}
    return {
        "a": old.id,
        "b": new.id,
        "inline": [
            {
                "kind": line.kind,
                "old_no": line.old_no,
                "new_no": line.new_no,
                "text": line.text,
                "pieces": _pieces(line.pieces),
            }
            for line in inline(old.text, new.text)
        ],
        "side_by_side": [
            {
                "kind": row.kind,
                "left_no": row.left_no,
                "left": "".join(p.text for p in row.left),
                "left_pieces": _pieces(row.left),
                "right_no": row.right_no,
                "right": "".join(p.text for p in row.right),
                "right_pieces": _pieces(row.right),
            }
            for row in side_by_side(old.text, new.text)
        ],
    }


def _pieces(pieces: tuple[Piece, ...]) -> list[dict[str, Any]]:
    return [{"text": p.text, "changed": p.changed} for p in pieces]


# -- views ------------------------------------------------------------------------------------


def _user() -> CurrentUser:
    user = current_user()
    assert user is not None  # login_required
    return user


@bp.route("/pages")
@login_required
def pages() -> Any:
    svc = services()
    query = request.args.get("q", "")[:SEARCH_MAX]
    rows = list_pages(svc, _user(), query)
    return render_template(
        "pages.html",
        pages=rows,
        query=query,
        digest_failure=channels.last_failure(svc, _user()),
        tag_feeds=channels.tag_feed_urls(svc, _user(), (t for p in rows for t in p["tags"])),
    )


@bp.route("/pages", methods=["POST"])
@login_required
def pages_add() -> Any:
    svc = services()
    try:
        added = add_page(
            svc,
            _user(),
            request.form.get("url", ""),
            request.form,
            request.form.get("browser") == "on",
        )
    except (BadRequest, QuotaRefused) as exc:
        flash(str(exc.description), "error")
        return (
            render_template(
                "pages.html",
                pages=list_pages(svc, _user()),
                url=request.form.get("url", "")[:2100],
                form={
                    name: request.form.get(name, "")[:2000]
                    for name in ("selector", "tags", "every", "cron", *FILTER_FIELDS)
                },
                browser=request.form.get("browser") == "on",
            ),
            exc.code,
        )
    flash(f"Now tracking {added['url']}.", "ok")
    return redirect(url_for("tracking.pages"), 303)


@bp.route("/pages/<id:page_id>/check", methods=["POST"])
@login_required
def pages_check(page_id: int) -> Any:
    limit("submit")
    batch_id = check_now(services(), _user(), page_id)
    return redirect(url_for("ui.batch", batch_id=batch_id), 303)


@bp.route("/pages/<id:page_id>/pause", methods=["POST"])
@login_required
def pages_pause(page_id: int) -> Any:
    paused = request.form.get("paused", "on") == "on"
    done = pause_page(services(), _user(), page_id, paused, request.args.get("tracking"))
    flash(f"{'Paused' if paused else 'Resumed'} {done['url']}.", "ok")
    return redirect(url_for("tracking.pages"), 303)


@bp.route("/pages/<id:page_id>/remove", methods=["POST"])
@login_required
def pages_remove(page_id: int) -> Any:
    url = remove_page(services(), _user(), page_id, request.args.get("tracking"))
    flash(f"No longer tracking {url}.", "ok")
    return redirect(url_for("tracking.pages"), 303)


@bp.route("/pages/<id:page_id>")
@login_required
def page(page_id: int) -> Any:
    svc = services()
    mode = request.args.get("mode", "inline")
    if mode not in ("inline", "side"):
        mode = "inline"
    data, old, new = snapshot_pair(
        svc,
        _user(),
        page_id,
        request.args.get("a"),
        request.args.get("b"),
        request.args.get("tracking"),
    )
    lines = inline(old.text, new.text) if old and new and mode == "inline" else []
    rows = side_by_side(old.text, new.text) if old and new and mode == "side" else []
    latest_text = new.text if new is not None and old is None else None
    return render_template(
        "page.html",
        page=data,
        old=old,
        new=new,
        mode=mode,
        lines=lines,
        rows=rows,
        latest_text=latest_text,
    )
