"""Analysis of check results: each fetch through the confirmed-change rule.

A ``check_page`` result updates its page (status, validators, title, error) and
each of the page's views (whole page, CSS selectors): a view's first text is its
baseline, a new text is pending until seen again (then a confirmed change and a
snapshot), anything seen before or a failed fetch changes nothing
(:mod:`crawler_app.change`).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from jodl.models import utcnow

from . import change
from .models import WHOLE_PAGE, AppCycle, Page, PageView, Snapshot, compress, decompress


def apply_chunk(s: Session, cycle_id: int, rows: list[Any], flip_window: int) -> None:
    """Apply one chunk of check results (execution id, job id, result JSON, finished).

    Pages already analysed for this cycle are skipped; the cycle's counts grow in
    the same transaction, so a redone chunk counts nothing twice.
    """
    by_job = {job_id: (result, finished) for _, job_id, result, finished in rows}
    pages = s.scalars(
        select(Page).where(
            Page.job_id.in_(list(by_job)),
            or_(Page.analysed_cycle_id.is_(None), Page.analysed_cycle_id != cycle_id),
        )
    ).all()
    if not pages:
        return
    views: dict[int, list[PageView]] = {}
    for view in s.scalars(
        select(PageView).where(PageView.page_id.in_([p.id for p in pages]))
    ).all():
        views.setdefault(view.page_id, []).append(view)
    counts = {"checked": 0, "not_modified": 0, "errors": 0, "changed": 0}
    for page in pages:
        result_json, finished = by_job[page.job_id]
        try:
            result = json.loads(result_json or "null") or {}
        except ValueError:
            result = {"ok": False, "error": "internal_error", "error_message": "bad result"}
        changed = apply_result(
            s, cycle_id, page, views.get(page.id, []), result, finished, flip_window
        )
        counts["checked"] += 1
        counts["not_modified"] += bool(result.get("not_modified"))
        counts["errors"] += not result.get("ok")
        counts["changed"] += changed
        page.analysed_cycle_id = cycle_id
    row = s.get(AppCycle, cycle_id)
    assert row is not None
    for key, value in counts.items():
        setattr(row, key, getattr(row, key) + value)


def apply_result(
    s: Session,
    cycle_id: int,
    page: Page,
    views: list[PageView],
    result: dict[str, Any],
    finished: dt.datetime | None,
    flip_window: int,
) -> int:
    """Apply one ``check_page`` result to its page and views; how many views changed.

    Each view goes through the confirmed-change rule (:func:`crawler_app.change.decide`):
    a failed fetch counts as nothing, a ``304`` means "the text fetched last", a
    confirmed or first state becomes a snapshot, a new text is kept as pending.
    """
    now = finished or utcnow()
    ok = bool(result.get("ok"))
    not_modified = bool(result.get("not_modified"))
    page.last_checked_at = now
    page.last_status = result.get("status")
    if ok:
        page.last_error = None
        if not not_modified:
            page.etag = result.get("etag")
            page.last_modified = result.get("last_modified")
            page.title = (result.get("title") or None) and result["title"][:300]
            whole = (result.get("views") or {}).get(WHOLE_PAGE) or {}
            page.fingerprint = whole.get("fingerprint") or page.fingerprint
    else:
        code = result.get("error") or "error"
        page.last_error = f"{code}: {result.get('error_message') or ''}".strip()
    seen = result.get("views") or {}
    changed = 0
    for view in views:
        fetched = seen.get(view.selector) or {}
        if not ok:
            new = None
        elif not_modified:
            new = view.pending or view.fingerprint
        elif view.selector not in seen or fetched.get("error"):
            continue  # a view added after the payload was made, or a bad selector
        else:
            new = fetched.get("fingerprint")
        history = [view.fingerprint, *(view.recent or [])] if view.fingerprint else []
        decision = change.decide(new, history, view.pending, flip_window=flip_window)
        text = fetched.get("text")
        if decision.store_snapshot and new is not None:
            if text is None and new == view.pending:
                text = decompress(view.pending_text)
            kind = "baseline" if decision.verdict == change.BASELINE else "change"
            s.add(
                Snapshot(
                    page_id=page.id,
                    selector=view.selector,
                    cycle_id=cycle_id,
                    taken_at=now,
                    status=result.get("status"),
                    kind=kind,
                    fingerprint=new,
                    text_z=compress(text),
                    chars=len(text or ""),
                )
            )
            if view.fingerprint:
                window = max(1, flip_window)
                view.recent = [view.fingerprint, *(view.recent or [])][:window]
            view.fingerprint = new
            if kind == "change":
                view.last_changed_at = now
                page.last_changed_at = now
                changed += 1
        if decision.pending != view.pending:
            view.pending = decision.pending
            view.pending_text = compress(text) if decision.pending else None
            view.pending_since = now if decision.pending else None
    return changed
