"""Baselines: taken at once for a new tracking, kept for views from before the model.

A view's *baseline* is the state its trackers were last told about; a change is
a difference from it (:mod:`crawler_app.checking.confirm`). Without one, a check only
takes one, so an edit made before the first check would never be reported.

* **At once.** Tracking a page (``jodl track``, the web UI, the API) or "Check
  now" on a view without a baseline queues an on-demand ``check_page`` job for
  it (:func:`request`, key ``baseline:<url>``, placed by host like the cycle's
  checks). Its check fetches twice, so what varies is learned from the start.
  :func:`apply` stores the result as the views' baselines; the master's
  scheduler calls it every couple of seconds, and every cycle calls it before
  preparing its checks. A view that got a baseline some other way keeps it.
* **Migrated views.** A view kept from before models were learned has a
  baseline snapshot but no model; :func:`adopt_migrated` builds the model from
  that snapshot's text, so its next check compares with it instead of silently
  taking a new baseline.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, NamedTuple

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from jodl.log import Reads
from jodl.queue import Queue

from ..fetching.reach import AllowUsers, Reach, allowlisted_pages
from ..models import decompress
from ..settings import AppSettings
from ..users.pages import CHECK_FAMILY, check_payload, family_id
from . import analysis, confirm, queries
from .check_result import CheckResult
from .variance import Model, text_keys

#: Prefix of the queue keys of baseline checks (the URL follows, so placement finds the host).
KEY_PREFIX = "baseline:"
#: Priority in the on-demand queue: someone just asked for the page.
PRIORITY = 10


class _Wanted(NamedTuple):
    """A tracked page with views that have no baseline."""

    url: str
    browser: bool
    selectors: set[str]


def _missing(s: Session, page_ids: Iterable[int] | None = None) -> dict[int, _Wanted]:
    """Tracked pages (not all of whose trackings are paused) with views that have no
    baseline."""
    rows = queries.views_without_baseline(s, None if page_ids is None else list(page_ids))
    out: dict[int, _Wanted] = {}
    for page_id, url, browser, selector in rows:
        out.setdefault(page_id, _Wanted(url, browser, set())).selectors.add(selector)
    return out


def request(
    queue: Queue, engine: Engine, page_ids: Iterable[int], allow: AllowUsers | None = None
) -> int:
    """Queue a baseline check of each of these pages that has a view without one.

    Call it after the tracking is committed. A page's check may use the fetch
    allowlist when one of its trackers is admitted by ``allow`` (default:
    ``JODL_FETCH_ALLOW_USERS``). Returns the number of pages queued.
    """
    if allow is None:
        allow = AppSettings.from_env().allow_users()
    with Session(engine) as s:
        wanted = _missing(s, page_ids)
        allowlisted = allowlisted_pages(s, allow, wanted) if wanted else set()
    if not wanted:
        return 0
    queue.enqueue_many(
        CHECK_FAMILY,
        [
            (
                KEY_PREFIX + w.url,
                check_payload(
                    w.url,
                    w.browser,
                    {sel: {"known": []} for sel in sorted(w.selectors)},
                    Reach.ALLOWLIST if page_id in allowlisted else Reach.PUBLIC,
                ),
            )
            for page_id, w in wanted.items()
        ],
        priority=PRIORITY,
    )
    return len(wanted)


def apply(engine: Engine) -> int:
    """Store the finished baseline checks' results as their views' baselines.

    Only views still without a baseline take one, from a result finished after
    the page's newest tracking began. Returns the number of views given one.
    """
    reads = Reads(engine)
    with Session(engine) as s, s.begin():
        wanted = _missing(s)
        if not wanted:
            return 0
        keys = {KEY_PREFIX + w.url: page_id for page_id, w in wanted.items()}
        jobs = reads.jobs_by_key(family_id(s, CHECK_FAMILY), list(keys), s.connection())
        latest = reads.latest_results([job_id for job_id, _ in jobs.values()], keep=1)
        done = {
            keys[key]: latest[job_id][0] for key, (job_id, _) in jobs.items() if latest.get(job_id)
        }
        since = queries.newest_tracking_since(s, list(done))
        done = {
            page_id: (exec_id, finished)
            for page_id, (exec_id, finished) in done.items()
            if finished is not None and page_id in since and finished >= since[page_id]
        }
        if not done:
            return 0
        texts = reads.result_texts(exec_id for exec_id, _ in done.values())
        pages = queries.analysed_pages_by_id(s, list(done))
        views = queries.analysed_views(s, [p["id"] for p in pages])
        snapshots: list[dict[str, Any]] = []
        changed: list[dict[str, Any]] = []
        applied = []
        for page in pages:
            exec_id, finished = done[page["id"]]
            if page["last_checked_at"] is not None and finished <= page["last_checked_at"]:
                continue  # applied already (a failed check leaves the views without one)
            applied.append(page)
            result = _baselines_only(analysis.decode_result(texts.get(exec_id)))
            page_views = views.get(page["id"], [])
            validators = page["etag"], page["last_modified"]
            before = [dict(v) for v in page_views]
            analysis.apply_result(None, page, page_views, result, finished, snapshots)
            if any(v["fingerprint"] is not None for v in before):
                # Views with a baseline were not judged by this check: a 304 to these
                # validators would hide a change of theirs.
                page["etag"], page["last_modified"] = validators
            changed.extend(v for v, old in zip(page_views, before, strict=True) if v != old)
        queries.write_analysed(s, applied, changed, snapshots)
        return len(snapshots)


def _baselines_only(result: CheckResult) -> CheckResult:
    views = result.views or {}
    kept = {sel: v for sel, v in views.items() if v.verdict == confirm.BASELINE}
    return replace(result, views=kept)


def adopt_migrated(
    s: Session, views: Iterable[tuple[int, int, str, str]]
) -> dict[tuple[int, str], dict[str, str]]:
    """Give each view (id, page id, selector, fingerprint) with a baseline but no model the
    model of its baseline snapshot; the models stored, by (page id, selector).

    Such views come from before models were learned. A view whose snapshot is gone
    gets none (its next check takes a new baseline).
    """
    adopted: dict[tuple[int, str], dict[str, str]] = {}
    for view_id, page_id, selector, fp in views:
        text_z = queries.baseline_text(s, page_id, selector, fp)
        if text_z is None:
            continue
        model = Model().rebased(text_keys(decompress(text_z) or "")).to_json()
        queries.set_view_model(s, view_id, model)
        adopted[(page_id, selector)] = model
    return adopted


__all__ = ["KEY_PREFIX", "PRIORITY", "adopt_migrated", "apply", "request"]
