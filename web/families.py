"""Operators' family pages and API: settings, node rules and jobs of each family.

The logic is :class:`jodl.admin.families.FamilyAdmin`'s, as for ``jodl family``;
these views translate its refusals (one line each) into 400 and 404 answers; a form
refused is shown again as typed, the refusal beside the field it names. The
API lives under ``/api/admin/families`` (JSON, the API's guard), the HTML views
under ``/admin/families`` (forms carrying the session's CSRF token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, flash, jsonify, redirect, render_template, request, url_for
from werkzeug.exceptions import BadRequest, NotFound

from jodl.admin.families import (
    JOB_STATES,
    SETTABLE,
    BadSetting,
    FamilyAdmin,
    FamilyInfo,
    check_labels,
)
from jodl.exceptions import UnknownFamily

from .api import body_as, query_as
from .auth import admin_required
from .schemas import FamilyChange, FamilyJobsQuery, FamilyNodes
from .services import services

#: Nested under the API's blueprint (web.app): ``/api/admin/families``, behind its guard.
api_bp = Blueprint("families_api", __name__, url_prefix="/admin/families")
bp = Blueprint("families", __name__, url_prefix="/admin/families")

#: Longest family name stored (the column's width).
NAME_MOST = 100


def _admin() -> FamilyAdmin:
    return FamilyAdmin(services().store)


def _name(name: str) -> str:
    """A name that can be a family's; anything else cannot name one (404)."""
    if not name or len(name) > NAME_MOST or "\x00" in name:
        raise NotFound("no such family")
    return name


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn``'s answer; its refusals as 404 (no family) or 400 (a bad value)."""
    try:
        return fn(*args, **kwargs)
    except UnknownFamily as exc:
        raise NotFound(str(exc)) from None
    except BadSetting as exc:
        raise BadRequest(str(exc)) from None


def _nodes_change(data: dict[str, Any]) -> tuple[list[str], bool, int | None, dict[str, str]]:
    """(addresses, allowed, max_slots, labels) from a JSON object or a form."""
    nodes = data.get("nodes")
    allowed = data.get("allowed", True)
    max_slots = data.get("max_slots")
    if isinstance(nodes, str):
        nodes = [n.strip() for n in nodes.replace(",", " ").split() if n.strip()]
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        raise BadRequest("nodes: a list of HOST:PORT texts")
    if not isinstance(allowed, bool):
        raise BadRequest("allowed: true or false")
    if max_slots is not None and (isinstance(max_slots, bool) or not isinstance(max_slots, int)):
        raise BadRequest("max_slots: a whole number or null")
    try:
        labels = check_labels(data.get("labels") or {})
    except BadSetting as exc:
        raise BadRequest(str(exc)) from None
    return nodes, allowed, max_slots, labels


# -- the API ----------------------------------------------------------------------------------


@api_bp.route("")
@admin_required
def api_list() -> Any:
    return jsonify({"families": [f.as_dict() for f in _admin().families()]})


@api_bp.route("/<name>", methods=["GET"])
@admin_required
def api_show(name: str) -> Any:
    return jsonify(_call(_admin().family, _name(name)).as_dict())


@api_bp.route("/<name>", methods=["PATCH"])
@admin_required
def api_update(name: str) -> Any:
    changes = body_as(FamilyChange).model_dump(exclude_unset=True)
    return jsonify(_call(_admin().update, _name(name), changes).as_dict())


@api_bp.route("/<name>/nodes", methods=["GET"])
@admin_required
def api_nodes(name: str) -> Any:
    info: FamilyInfo = _call(_admin().family, _name(name))
    return jsonify({"nodes": [r.as_dict() for r in info.nodes]})


@api_bp.route("/<name>/nodes", methods=["POST"])
@admin_required
def api_nodes_set(name: str) -> Any:
    nodes, allowed, max_slots, labels = _nodes_change(body_as(FamilyNodes).model_dump())
    info: FamilyInfo = _call(_admin().set_nodes, _name(name), nodes, allowed, max_slots, labels)
    return jsonify({"nodes": [r.as_dict() for r in info.nodes]})


@api_bp.route("/<name>/jobs")
@admin_required
def api_jobs(name: str) -> Any:
    query = query_as(FamilyJobsQuery)
    limit = 50 if query.limit is None else query.limit
    rows = _call(_admin().jobs, _name(name), query.state, limit)
    return jsonify({"jobs": [r.as_dict() for r in rows]})


# -- the operators' pages ---------------------------------------------------------------------


#: Form fields of the settings form (text inputs; empty: unchanged).
FORM_FIELDS = tuple(f for f in SETTABLE if f not in ("strategy_params", "idempotent"))


@dataclass(frozen=True)
class Refused:
    """A form the operator sent with a bad value: shown again as typed, the error by
    the field it names (``field``: None when the refusal names none)."""

    family: str
    form: str  # "settings" or "nodes"
    values: dict[str, str]
    error: str
    field: str | None


def _page(refused: Refused | None = None) -> Any:
    page = render_template(
        "families.html",
        families=_admin().families(),
        fields=FORM_FIELDS,
        states=JOB_STATES,
        refused=refused,
    )
    return (page, 400) if refused is not None else page


def _refused(name: str, form: str, fields: tuple[str, ...], exc: BadRequest) -> Any:
    """The page again with the form as typed and the refusal by its field; 400."""
    error = str(exc.description)
    named = error.partition(":")[0].strip()
    values = {f: request.form.get(f, "") for f in fields}
    return _page(Refused(name, form, values, error, named if named in fields else None))


@bp.route("/")
@admin_required
def index() -> Any:
    return _page()


#: Fields of the settings form, as typed (all text inputs).
SETTINGS_FORM = (*FORM_FIELDS, "strategy_params", "idempotent")
#: Fields of the node rules form.
NODES_FORM = ("nodes", "allowed", "max_slots", "labels")


@bp.route("/<name>", methods=["POST"])
@admin_required
def update(name: str) -> Any:
    form = request.form
    changes: dict[str, Any] = {f: form[f].strip() for f in FORM_FIELDS if form.get(f, "").strip()}
    if form.get("idempotent", "").strip():
        changes["idempotent"] = form["idempotent"].strip()
    try:
        if form.get("strategy_params", "").strip():
            try:
                changes["strategy_params"] = json.loads(form["strategy_params"])
            except ValueError:
                raise BadRequest("strategy_params: not JSON") from None
        _call(_admin().update, _name(name), changes)
    except BadRequest as exc:  # nothing was saved: update applies all or nothing
        return _refused(name, "settings", SETTINGS_FORM, exc)
    flash(f"family {name} updated", "ok")
    return redirect(url_for("families.index"), 303)


def _allowed(text: str) -> bool:
    text = text.strip().lower()
    if text not in ("true", "false", "allow", "deny", ""):
        raise BadRequest("allowed: true or false")
    return text in ("true", "allow", "")


@bp.route("/<name>/nodes", methods=["POST"])
@admin_required
def nodes(name: str) -> Any:
    form = request.form
    max_slots = form.get("max_slots", "").strip()
    try:
        data: dict[str, Any] = {
            "nodes": form.get("nodes", ""),
            "allowed": _allowed(form.get("allowed", "true")),
            "labels": [item for item in form.get("labels", "").split() if item],
        }
        if max_slots:
            try:
                data["max_slots"] = int(max_slots)
            except ValueError:
                raise BadRequest("max_slots: a whole number") from None
        nodes, allowed, cap, labels = _nodes_change(data)
        _call(_admin().set_nodes, _name(name), nodes, allowed, cap, labels)
    except BadRequest as exc:
        return _refused(name, "nodes", NODES_FORM, exc)
    flash(f"family {name}: {'allowed' if allowed else 'denied'} on {', '.join(nodes)}", "ok")
    return redirect(url_for("families.index"), 303)
