"""Operator views (admin role): nodes, runs with live progress, queue counts, actions.

Operators add and remove agent nodes (the serving master picks the change up
within a second), and request an application cycle now: the request is a row
in the database that a running master's scheduler (``jodl master`` or
``jodl up``) takes within a couple of seconds (see :mod:`crawler_app.cycle_requests`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from werkzeug.exceptions import BadRequest, Conflict, NotFound

from crawler_app import cycle_requests
from jodl import collect_status as collect
from jodl.agent import split_address
from jodl.log import ExecState, RequestKind, RunState

from .auth import admin_required, current_user
from .schemas import LISTED_STATES
from .services import Services, services

bp = Blueprint("admin", __name__, url_prefix="/admin")

#: Failed attempts listed (newest first, with their error) on a run's page at most.
FAILURES_LISTED = 100
#: Most slots an operator may give a node from the web UI.
MAX_SLOTS = 10_000
#: A run's attempts per page of its listing (the API may ask for up to 500).
JOBS_PER_PAGE = 50


def _iso(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="seconds") + "Z"
    return value


def overview(svc: Services, runs: int = 10) -> dict[str, Any]:
    """Nodes, families, queue counts and recent runs; running runs with live progress."""
    data = collect(svc.store, runs=runs)
    running = [r["id"] for r in data["runs"] if r["state"] == RunState.RUNNING]
    progress = svc.store.reads.outcome_counts(running)
    for run in data["runs"]:
        if run["id"] in progress:
            counts = progress[run["id"]]
            run["jobs_done"] = counts.get(ExecState.DONE, 0)
            run["jobs_failed"] = counts.get(ExecState.FAILED, 0)
        total = run["jobs_total"] or 0
        run["percent"] = round(100.0 * run["jobs_done"] / total, 1) if total else None
    for node in data["nodes"]:
        node["last_seen"] = _iso(node["last_seen"])
    for master in data["masters"]:
        master["started_at"] = _iso(master["started_at"])
        master["expires_at"] = _iso(master["expires_at"])
    for run in data["runs"]:
        run["started_at"] = _iso(run["started_at"])
        run["finished_at"] = _iso(run["finished_at"])
    data["queue"] = svc.queue.counts()
    data["can_start_cycle"] = True
    data["cycle_requests"] = cycle_requests.pending(svc.engine)
    # The page shows what became of each recent request too, not only the waiting ones.
    data["recent_cycle_requests"] = cycle_requests.recent(svc.engine)
    return data


def add_node(svc: Services, address: str, slots: int) -> str:
    """Register (or bring back) the agent at ``address``; a line saying so."""
    try:
        split_address(address)
    except ValueError as exc:
        raise BadRequest(f"address: {exc}") from None
    if not 1 <= slots <= MAX_SLOTS:
        raise BadRequest(f"slots: a whole number from 1 to {MAX_SLOTS}")
    node = svc.store.add_node(address, slots=slots)
    return f"node {node.address} added ({node.slots} slots)"


def remove_node(svc: Services, address: str) -> str:
    if not address or len(address) > 255 or not svc.store.remove_node(address):
        raise NotFound(f"no node {address[:255]!r}")
    return f"node {address} removed"


def drain_node(svc: Services, address: str) -> str:
    """Drain the agent at ``address``: nothing new goes there, then it exits and is removed."""
    if not address or len(address) > 255 or not svc.store.drain_node(address):
        raise NotFound(f"no node {address[:255]!r}")
    return f"node {address} draining"


def reload_nodes(svc: Services, address: str | None) -> str:
    """Ask the agent at ``address`` (None: every live node's) to read its installed
    families again; the running master relays it within a second."""
    if address is not None and (not address or len(address) > 255):
        raise NotFound(f"no node {address[:255]!r}")
    asked = svc.store.ask_reload(address)
    if not asked:
        raise NotFound(f"no live node {address!r}" if address else "no live nodes")
    who = f"node {asked[0]}" if address else f"{len(asked)} node(s)"
    return f"reload of the families asked of {who}: the running master relays it within seconds"


def start_cycle(svc: Services) -> dict[str, Any]:
    """Record the current operator's request for a cycle now: its id and a line saying so."""
    user = current_user()
    request_id = cycle_requests.request_cycle(svc.engine, user.id if user else None)
    return {
        "id": request_id,
        "state": "requested",
        "message": (
            "cycle requested: a running master starts it within seconds "
            "(after the cycle in progress, if any); progress shows under Runs"
        ),
    }


def cancel_run(svc: Services, run_id: int) -> dict[str, Any]:
    """End run ``run_id`` while it runs: asked of the running master (which stops its
    jobs, on their agents too), or recorded at once when no master runs; a message."""
    reads = svc.store.reads
    row = reads.run(run_id)
    family = reads.family_of_run(run_id)
    if row is None or family is None:
        raise NotFound("no such run")
    if row.state != RunState.RUNNING:
        raise Conflict(f"run {family}#{row.number} is {row.state}, not running")
    if svc.store.running_master() is not None:
        request_id = svc.store.request_run(family, RequestKind.CANCEL)
        return {
            "id": request_id,
            "state": "requested",
            "message": f"cancel of run {family}#{row.number} asked of the running master",
        }
    svc.store.cancel_open_run(family)
    return {"state": "cancelled", "message": f"run {family}#{row.number} cancelled"}


def run_jobs(svc: Services, run_id: int, args: Any, limit: int = JOBS_PER_PAGE) -> dict[str, Any]:
    """One page of a run's attempts, filtered by ``state`` and ``key`` (text in the
    job's key), after the execution ``after``; ``next`` is the cursor of the next page."""
    state = args.get("state") or None
    if state is not None and state not in LISTED_STATES:
        raise BadRequest(f"state: one of {', '.join(LISTED_STATES)}")
    key = (args.get("key") or "").strip()[:200] or None
    try:
        after = min(max(int(args.get("after") or 0), 0), 2**62)
        limit = int(args.get("limit") or limit)
    except ValueError:
        raise BadRequest("after, limit: whole numbers") from None
    if svc.store.reads.run(run_id) is None:
        raise NotFound("no such run")
    rows = svc.store.reads.run_executions(run_id, state=state, key=key, after=after, limit=limit)
    return {
        "jobs": [
            {
                "exec_id": r.exec_id,
                "key": r.key,
                "node": r.address,
                "attempt": r.attempt,
                "state": r.state,
                "backup": r.backup,
                "sent_at": _iso(r.sent_at),
                "finished_at": _iso(r.finished_at),
                "duration": r.duration,
                "result": r.result,
                "error": r.error,
            }
            for r in rows
        ],
        "state": state,
        "key": key,
        "next": rows[-1].exec_id if len(rows) >= max(1, min(limit, 500)) else None,
        "running": [
            {
                "key": r.key,
                "node": r.address,
                "done": r.done,
                "total": r.total,
                "note": r.note,
                "reported_at": _iso(r.reported_at),
            }
            for r in svc.store.reads.running_jobs(run_id)
        ],
    }


def _slots(text: str | None) -> int:
    try:
        return int(text or "1")
    except ValueError:
        raise BadRequest("slots: a whole number") from None


@bp.route("/")
@admin_required
def index() -> Any:
    return render_template("admin.html", data=overview(services()))


@bp.route("/runs/<id:run_id>")
@admin_required
def run(run_id: int) -> Any:
    svc = services()
    reads = svc.store.reads
    row = reads.run(run_id)
    if row is None:
        raise NotFound("no such run")
    family = reads.family_of_run(run_id)
    counts = reads.outcome_counts([run_id]).get(run_id, {})
    failures = reads.failed_attempts(run_id, FAILURES_LISTED)
    jobs = run_jobs(svc, run_id, request.args)
    return render_template(
        "run.html",
        run=row,
        family=family,
        counts=counts,
        failures=failures,
        jobs=jobs,
        states=LISTED_STATES,
    )


@bp.route("/runs/<id:run_id>/cancel", methods=["POST"])
@admin_required
def run_cancel(run_id: int) -> Any:
    flash(cancel_run(services(), run_id)["message"], "ok")
    return redirect(url_for("admin.run", run_id=run_id), 303)


@bp.route("/nodes", methods=["POST"])
@admin_required
def nodes_add() -> Any:
    svc = services()
    address = request.form.get("address", "").strip()
    flash(add_node(svc, address, _slots(request.form.get("slots"))), "ok")
    return redirect(url_for("admin.index"), 303)


@bp.route("/nodes/remove", methods=["POST"])
@admin_required
def nodes_remove() -> Any:
    flash(remove_node(services(), request.form.get("address", "").strip()), "ok")
    return redirect(url_for("admin.index"), 303)


@bp.route("/nodes/drain", methods=["POST"])
@admin_required
def nodes_drain() -> Any:
    flash(drain_node(services(), request.form.get("address", "").strip()), "ok")
    return redirect(url_for("admin.index"), 303)


@bp.route("/nodes/reload", methods=["POST"])
@admin_required
def nodes_reload() -> Any:
    address = request.form.get("address")
    flash(reload_nodes(services(), address.strip() if address is not None else None), "ok")
    return redirect(url_for("admin.index"), 303)


@bp.route("/cycle", methods=["POST"])
@admin_required
def cycle() -> Any:
    flash(start_cycle(services())["message"], "ok")
    return redirect(url_for("admin.index"), 303)
