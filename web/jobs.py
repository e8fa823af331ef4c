"""Jobs over HTTP, for clients in any language: add jobs to a family (run by its next
cycle) or to the on-demand queue, and read their results.

Operators may use every family; a token an operator scopes to some families
(``POST /api/tokens`` with ``{"families": [...]}``) may use those families' jobs and
results and nothing else of the API, so a service holds only what it needs. Adding
is as strict as ``jodl.add_jobs``: a family neither in the database nor installed is
refused, a payload must be a JSON object, and a bad row refuses the whole request
with its index (nothing is added).
"""

from __future__ import annotations

from typing import Any

from werkzeug.exceptions import BadRequest, Forbidden, NotFound

from jodl import add_jobs
from jodl.exceptions import JodlError

from .auth import CurrentUser
from .schemas import Jobs, QueuedJobs
from .services import Services

#: Results one read returns at most.
MAX_RESULTS = 500


def check_access(user: CurrentUser, family: str) -> None:
    """403 unless ``user`` may use ``family``'s jobs: an operator, through the whole
    account or a token scoped to that family."""
    if not user.is_admin:
        raise Forbidden("operators only (or a token an operator scoped to this family)")
    if user.families is not None and family not in user.families:
        raise Forbidden(f"this token is not for the family {family!r}")


def token_families(families: list[str] | None, user: CurrentUser) -> tuple[str, ...] | None:
    """The families a token asked for (None: the whole account), as the body
    (:class:`web.schemas.TokenRequest`) named them."""
    if families is None:
        return None
    if not user.is_admin:
        raise Forbidden("only operators issue tokens for families' jobs")
    if user.families is not None:
        raise Forbidden("a token scoped to families cannot issue tokens")
    return tuple(dict.fromkeys(families))


def _rows(data: Jobs) -> list[tuple[str, dict[str, Any]]]:
    """The body's jobs as (key, payload) pairs (web/schemas.py checked each row)."""
    return [(job.key, job.payload) for job in data.jobs]


def add_to_family(svc: Services, family: str, data: Jobs) -> dict[str, Any]:
    """Add the body's jobs to ``family`` (all or none); how many were new."""
    rows = _rows(data)
    try:
        added = add_jobs(family, rows, store=svc.store)
    except JodlError as exc:
        raise BadRequest(str(exc)) from None
    return {"family": family, "added": added, "sent": len(rows)}


def family_results(svc: Services, family: str, after: Any, limit: Any) -> dict[str, Any]:
    """Committed results of ``family``'s jobs after the cursor ``after``; ``next`` is the
    cursor to pass next time (the same one when nothing is new)."""
    cursor, count = _whole(after, "after", 0), _whole(limit, "limit", 100)
    if svc.store.family(family) is None:
        raise NotFound(f"no family {family!r} in the database")
    rows = svc.store.reads.family_results(family, cursor, min(max(count, 1), MAX_RESULTS))
    return {
        "family": family,
        "results": [
            {
                "key": r.key,
                "run": r.run_number,
                "result": r.result,
                "finished_at": r.finished_at.isoformat() if r.finished_at else None,
                "cursor": r.exec_id,
            }
            for r in rows
        ],
        "next": rows[-1].exec_id if rows else cursor,
    }


def add_to_queue(svc: Services, family: str, data: QueuedJobs) -> dict[str, Any]:
    """Queue the body's jobs on demand (a key queued again is updated in place)."""
    rows = _rows(data)
    try:
        ids = svc.queue.enqueue_many(family, rows, delay=data.delay)
    except JodlError as exc:
        raise BadRequest(str(exc)) from None
    return {"family": family, "queued": len(ids)}


def queued_job(svc: Services, family: str, key: str) -> dict[str, Any]:
    """A queued job's state, attempts and result (decoded JSON, once it has one)."""
    job = svc.queue.get(family, key)
    if job is None:
        raise NotFound(f"no job {key!r} of {family!r} in the queue")
    return {
        "family": family,
        "key": key,
        "state": job.state,
        "attempts": job.attempts,
        "failures": job.failures,
        "last_error": job.last_error,
        "result": svc.queue.result(family, key),
    }


def _whole(value: Any, name: str, default: int) -> int:
    if value in (None, ""):
        return default
    try:
        return min(max(int(value), 0), 2**62)
    except (TypeError, ValueError):
        raise BadRequest(f"{name}: a whole number") from None


__all__ = [
    "add_to_family",
    "add_to_queue",
    "check_access",
    "family_results",
    "queued_job",
    "token_families",
]
