"""Analysis of check results: each view's verdict stored.

A ``check_page`` result updates its page (status, validators, title, error, the
script-built flag) and each of the page's views (whole page, filters:
:mod:`crawler_app.fetching.filters`). The agent judged each view over the fetches of its
check (:mod:`crawler_app.checking.confirm`): a ``baseline`` or a ``change`` becomes a
snapshot (a change is notified, unless the view has a trigger its new text
lacks: then it is a ``quiet`` snapshot, the new baseline), and what the fetches
taught about the view's noise is kept in its model; a view left without text
says why in its ``problem``. A failed fetch or a ``304`` changes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy.orm import Session

from jodl.log import utcnow

from ..fetching.filters import FilterError, ViewSpec
from ..models import WHOLE_PAGE, compress
from . import confirm, queries
from .check_result import CheckResult, ViewResult

#: Snapshot kind of a confirmed change the view's trigger kept from its trackers.
QUIET = "quiet"
#: Exact fingerprints of fetches judged the same as a view's baseline, kept so the next
#: fetch with one of them is settled at once (an A/B variant, a CDN edge's stamp).
KNOWN_FINGERPRINTS = 8


def apply_chunk(s: Session, cycle_id: int, rows: list[Any]) -> None:
    """Apply one chunk of check results (execution id, job id, result JSON, finished).

    Pages already analysed for this cycle are skipped; the cycle's counts grow in
    the same transaction, so a redone chunk counts nothing twice.
    """
    by_job = {job_id: (result, finished) for _, job_id, result, finished in rows}
    pages = queries.pages_to_analyse(s, list(by_job), cycle_id)
    if not pages:
        return
    views = queries.analysed_views(s, [p["id"] for p in pages])
    counts = {"checked": 0, "not_modified": 0, "errors": 0, "changed": 0}
    snapshots: list[dict[str, Any]] = []
    changed_views: list[dict[str, Any]] = []
    for page in pages:
        result_json, finished = by_job[page["job_id"]]
        result = decode_result(result_json)
        page_views = views.get(page["id"], [])
        before = [dict(v) for v in page_views]
        changed = apply_result(cycle_id, page, page_views, result, finished, snapshots)
        changed_views.extend(v for v, old in zip(page_views, before, strict=True) if v != old)
        counts["checked"] += 1
        counts["not_modified"] += result.not_modified
        counts["errors"] += not result.ok
        counts["changed"] += changed
        page["analysed_cycle_id"] = cycle_id
    queries.write_analysed(s, pages, changed_views, snapshots)
    queries.add_cycle_counts(s, cycle_id, counts)


def view_problem(key: str, fetched: ViewResult) -> str | None:
    """Why a good fetch gave the view ``key`` no text, in one line for its trackers; None
    when it gave some."""
    if fetched.error:
        return str(fetched.error)[:500]
    if fetched.chars:
        return None
    try:
        spec = ViewSpec.parse(key)
    except FilterError as exc:
        return str(exc)
    if spec.selector is not None and fetched.matches == 0:
        return f"the selector {spec.selector} matches nothing on the page"
    if spec.filters_lines:
        return "the line filters leave no text of the page"
    return "the page has no text there"


def _triggered(key: str, text: str | None) -> bool:
    """Whether a change of the view ``key`` to ``text`` is told (its trigger, if any)."""
    try:
        return ViewSpec.parse(key).triggered(text)
    except FilterError:
        return True


def decode_result(text: str | None) -> CheckResult:
    """A stored ``check_page`` result (a bad one reads as an internal error)."""
    try:
        data = json.loads(text or "null") or {}
    except ValueError:
        data = None
    return CheckResult.from_json(data)


def _seen_more(model: dict[str, str] | None, fetches: Any) -> dict[str, str] | None:
    """``model`` counting ``fetches`` more good fetches of its view (``Model.seen``)."""
    if not model or not isinstance(fetches, int) or fetches <= 0:
        return model
    return {**model, "seen": str(int(model.get("seen") or 0) + fetches)}


def apply_result(
    cycle_id: int,
    page: dict[str, Any],
    views: list[dict[str, Any]],
    result: CheckResult,
    finished: dt.datetime | None,
    snapshots: list[dict[str, Any]],
) -> int:
    """Apply one ``check_page`` result to its page and views; how many views changed.

    ``page`` and ``views`` are rows (dicts of :class:`Page` and :class:`PageView`
    columns), changed in place; new :class:`Snapshot` rows are appended to
    ``snapshots``. A failed fetch (an error page included) and a ``304`` leave the
    views as they are.
    """
    now = finished or utcnow()
    page["last_checked_at"] = now
    page["last_status"] = result.status
    if result.script_page is not None:
        page["script_page"] = bool(result.script_page)
    if result.refused_requests is not None:
        page["refused_requests"] = result.refused_requests
    if not result.ok:
        code = result.error or "error"
        page["last_error"] = f"{code}: {result.error_message or ''}".strip()
        return 0
    page["last_error"] = None
    if result.not_modified:
        return 0
    page["etag"] = result.etag
    page["last_modified"] = result.last_modified
    page["title"] = (result.title or None) and result.title[:300]
    seen = result.views or {}
    whole = seen.get(WHOLE_PAGE)
    page["fingerprint"] = (whole and whole.fingerprint) or page["fingerprint"]
    changed = 0
    for view in views:
        fetched = seen.get(view["selector"])
        if not fetched:
            continue  # a view added after the payload was made
        view["problem"] = view_problem(view["selector"], fetched)
        if fetched.error or not fetched.verdict:
            continue  # a bad selector, no text
        verdict, new = fetched.verdict, fetched.fingerprint
        if verdict == confirm.BASELINE and view["fingerprint"] is not None:
            continue  # a baseline taken meanwhile (checking.baselines) stays the baseline
        if fetched.model:
            view["model"] = fetched.model
        view["model"] = _seen_more(view["model"], fetched.fetches)
        if verdict in (confirm.SAME, confirm.NOISE):
            if new != view["fingerprint"] and new not in (view["recent"] or []):
                view["recent"] = [new, *(view["recent"] or [])][:KNOWN_FINGERPRINTS]
            continue
        text = fetched.text
        kind = "change" if verdict == confirm.CHANGE and view["fingerprint"] else "baseline"
        if kind == "change" and not _triggered(view["selector"], text):
            kind = QUIET
        snapshots.append(
            {
                "page_id": page["id"],
                "selector": view["selector"],
                "cycle_id": cycle_id,
                "taken_at": now,
                "status": result.status,
                "kind": kind,
                "fingerprint": new,
                "text_z": compress(text),
                "chars": len(text or ""),
            }
        )
        view["fingerprint"] = new
        view["recent"] = []
        if kind == "change":
            view["last_changed_at"] = now
            page["last_changed_at"] = now
            changed += 1
    return changed
