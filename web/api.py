"""The JSON API: everything the HTML views do, described by ``/api/openapi.json``.

Authentication: the session cookie (log in with ``POST /api/session``; then
every state-changing request carries the session's token in ``X-CSRF-Token``),
a bearer token from ``POST /api/tokens`` (``Authorization: Bearer …``), or
HTTP Basic credentials on each request (a password hash each time: slow). Tokens
and Basic need no CSRF token. State-changing
requests must send JSON (``Content-Type: application/json``), which a page of
another site cannot make a browser send without the API's consent.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, request, url_for
from werkzeug.exceptions import BadRequest, Forbidden, NotFound, UnsupportedMediaType

from crawler_app import PageError, QuotaExceeded
from jodl import scrape_targets

from . import admin, channels, jobs, tracking
from .auth import (
    SIGNUP_SENT,
    TOKEN_SECONDS,
    admin_required,
    check_credentials,
    current_user,
    end_session,
    fetch_reach,
    issue_token,
    limit,
    login_required,
    sign_up,
    start_session,
    submission_rules,
)
from .batch import SubmissionError
from .openapi import document
from .quota import refused, set_user_quota, usage
from .refusals import InputT, validated
from .schemas import (
    Credentials,
    Jobs,
    NewChannel,
    NewNode,
    NodeAddress,
    NodeReload,
    NoFields,
    QueuedJobs,
    QuotaChange,
    ResultsQuery,
    RunJobsQuery,
    Signup,
    TokenRequest,
    TrackingChange,
    new_tracking_body,
    urls_body,
)
from .security import CSRF_HEADER, csrf_token, csrf_valid
from .services import services

bp = Blueprint("api", __name__, url_prefix="/api")


@bp.before_request
def _guard() -> None:
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    has_body = bool(request.content_length) or request.headers.get("Transfer-Encoding")
    if (has_body or request.method in ("POST", "PUT", "PATCH")) and not request.is_json:
        raise UnsupportedMediaType("send JSON (Content-Type: application/json)")
    user = current_user()
    if (
        user is not None
        and user.via == "session"
        and not csrf_valid(request.headers.get(CSRF_HEADER))
    ):
        raise Forbidden(f"send the session's CSRF token in {CSRF_HEADER} (GET /api/session)")


def body() -> dict[str, Any]:
    """The request's JSON object; 400 when the body is not one, or holds a string
    that cannot be stored (a lone surrogate such as ``"\\ud800"``, a NUL)."""
    try:
        data = request.get_json(silent=True)
    except RecursionError:  # nested deeper than the JSON parser goes
        data = None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    if not _encodable(data):
        raise BadRequest(
            "the body holds a string that cannot be stored: a lone surrogate or a NUL character"
        )
    return data


def body_as(model: type[InputT], *, optional: bool = False) -> InputT:
    """The request's JSON object validated by ``model`` (web/schemas.py, which the
    OpenAPI document shows); 400 naming the first refused field. ``optional``: an
    empty body is an empty object."""
    if optional and not request.get_data(cache=True).strip():
        return validated(model, {})
    return validated(model, body())


def query_as(model: type[InputT]) -> InputT:
    """The query parameters validated by ``model`` (the document's parameters)."""
    return validated(model, request.args.to_dict())


def _encodable(value: Any) -> bool:
    """True when every string (and key) inside ``value`` can be stored: UTF-8, no NUL
    (which PostgreSQL's text columns refuse)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
            if "\x00" in item:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def url_list() -> list[Any]:
    """The body's URLs (each item is checked on its own: a bad one is refused alone)."""
    return list(body_as(urls_body(services().settings)).model_dump()["urls"])


def _user_json(user: Any) -> dict[str, Any] | None:
    if user is None:
        return None
    return {"id": user.id, "email": user.email, "is_admin": bool(user.is_admin)}


@bp.route("")
@bp.route("/")
def index() -> Any:
    return jsonify(
        {
            "openapi": url_for("api.openapi"),
            "batches": url_for("api.batches_create"),
            "health": url_for("ops.healthz"),
            "metrics": url_for("ops.metrics"),
        }
    )


@bp.route("/openapi.json")
def openapi() -> Any:
    return jsonify(document(services().settings))


# -- batches ----------------------------------------------------------------------------------


@bp.route("/batches", methods=["POST"])
def batches_create() -> Any:
    svc = services()
    rules = submission_rules()
    limit("submit")
    urls = url_list()
    user = current_user()
    try:
        submitted = svc.batches.submit(
            urls, user.id if user else None, admit=rules.admit, most=rules.most, reach=rules.reach
        )
    except SubmissionError as exc:
        raise BadRequest(str(exc)) from None
    except QuotaExceeded as exc:
        raise refused(svc.metrics, exc) from None
    svc.metrics.inc("jodl_web_batches_total")
    for how in ("cached", "queued", "refused"):
        svc.metrics.inc("jodl_web_urls_total", getattr(submitted, how), answer=how)
    items = [
        {
            "position": i.position,
            "url": i.url,
            "answer": "refused" if i.error else ("cached" if i.cached_exec_id else "queued"),
            "error": i.error,
        }
        for i in submitted.items
    ]
    return (
        jsonify(
            {
                "id": submitted.id,
                "size": len(items),
                "duplicates": submitted.duplicates,
                "cached": submitted.cached,
                "queued": submitted.queued,
                "refused": submitted.refused,
                "refreshed": submitted.refreshed,
                "items": items,
                "events": url_for("stream.batch_stream", batch_id=submitted.id),
                "page": url_for("ui.batch", batch_id=submitted.id),
                "self": url_for("api.batches_get", batch_id=submitted.id),
            }
        ),
        201,
        {"Location": url_for("api.batches_get", batch_id=submitted.id)},
    )


@bp.route("/batches/<batch_id>")
def batches_get(batch_id: str) -> Any:
    """The batch's answers so far (the event stream gives them as they arrive)."""
    svc = services()
    loaded = svc.batches.load(batch_id)
    if loaded is None:
        raise NotFound("no such batch (batches are kept for a week)")
    batch, items = loaded
    results = svc.batches.immediate(items)
    pending = [i for i in items if i.pending]
    arrived = svc.batches.arrived(pending)
    done = {i.position for i, _ in arrived}
    arrived += svc.batches.given_up(i for i in pending if i.position not in done)
    results += [event for _, event in arrived]
    results.sort(key=lambda e: e["position"])
    answered = {e["position"] for e in results}
    return jsonify(
        {
            "id": batch.id,
            "created_at": batch.created_at.isoformat(timespec="seconds") + "Z",
            "size": batch.size,
            "complete": len(answered) == len(items),
            "pending": [i.position for i in items if i.position not in answered],
            "results": results,
        }
    )


@bp.route("/reset", methods=["POST"])
@login_required
def reset() -> Any:
    svc = services()
    user = current_user()
    try:
        outcome = svc.batches.reset(url_list(), user.id if user else None, fetch_reach())
    except SubmissionError as exc:
        raise BadRequest(str(exc)) from None
    svc.metrics.inc("jodl_web_cache_resets_total", len(outcome["forgotten"]))
    return jsonify(outcome)


# -- accounts ---------------------------------------------------------------------------------


@bp.route("/users", methods=["POST"])
def signup() -> Any:
    svc = services()
    if not svc.settings.web_signup:
        raise Forbidden("sign-up is closed; ask an operator for an account")
    limit("signup")
    data = body_as(Signup)
    try:
        sign_up(data.email, data.password)
    except PageError as exc:
        raise BadRequest(str(exc)) from None
    # The same answer whether the address had an account: nothing to enumerate.
    return jsonify({"message": SIGNUP_SENT}), 202


@bp.route("/session", methods=["GET"])
def session_get() -> Any:
    return jsonify({"user": _user_json(current_user()), "csrf_token": csrf_token()})


@bp.route("/session", methods=["POST"])
def session_create() -> Any:
    data = body_as(Credentials)
    user = check_credentials(data.email, data.password)
    if user is None:
        return jsonify({"error": "unauthorized", "message": "wrong e-mail or password"}), 401
    start_session(user)
    return jsonify({"user": _user_json(user), "csrf_token": csrf_token()})


@bp.route("/session", methods=["DELETE"])
def session_delete() -> Any:
    """Log out: every session and token of the user ends."""
    end_session()
    return "", 204


@bp.route("/tokens", methods=["POST"])
@login_required
def tokens_create() -> Any:
    """A bearer token: API requests without a password hash each (revoked by logout);
    with ``{"families": [...]}``, for those families' jobs and results only."""
    user = _me()
    families = jobs.token_families(body_as(TokenRequest, optional=True).families, user)
    out: dict[str, Any] = {"token": issue_token(user, families), "expires_in": TOKEN_SECONDS}
    if families is not None:
        out["families"] = list(families)
    return jsonify(out), 201


# -- jobs over HTTP -----------------------------------------------------------------------------


@bp.route("/families/<name>/jobs", methods=["POST"])
@login_required
def family_jobs_add(name: str) -> Any:
    jobs.check_access(_me(), name)
    return jsonify(jobs.add_to_family(services(), name, body_as(Jobs))), 201


@bp.route("/families/<name>/results")
@login_required
def family_results(name: str) -> Any:
    jobs.check_access(_me(), name)
    query = query_as(ResultsQuery)
    return jsonify(jobs.family_results(services(), name, query.after, query.limit))


@bp.route("/queue/<name>/jobs", methods=["POST"])
@login_required
def queue_jobs_add(name: str) -> Any:
    jobs.check_access(_me(), name)
    return jsonify(jobs.add_to_queue(services(), name, body_as(QueuedJobs))), 201


@bp.route("/queue/<name>/jobs/<path:key>")
@login_required
def queue_job(name: str, key: str) -> Any:
    jobs.check_access(_me(), name)
    return jsonify(jobs.queued_job(services(), name, key))


# -- tracked pages ------------------------------------------------------------------------------


def _me() -> Any:
    user = current_user()
    assert user is not None
    return user


@bp.route("/pages")
@login_required
def pages_list() -> Any:
    return jsonify({"pages": tracking.list_pages(services(), _me(), request.args.get("q"))})


@bp.route("/pages", methods=["POST"])
@login_required
def pages_add() -> Any:
    svc = services()
    data = body_as(new_tracking_body(svc.settings)).model_dump(exclude_unset=True)
    added = tracking.add_page(
        svc, _me(), data["url"], data, data.get("browser", False), json_body=True
    )
    return jsonify(added), 201


@bp.route("/pages/<id:page_id>", methods=["PATCH"])
@login_required
def pages_update(page_id: int) -> Any:
    data = body_as(TrackingChange).model_dump(exclude_unset=True)
    if not data:
        raise BadRequest("paused: true or false (or tags: a list, every, cron, name)")
    which = request.args.get("tracking")
    done: dict[str, Any] = {"id": page_id}
    if "tags" in data:  # checked first: a refused body changes nothing
        tracking.tags_from(data["tags"])
    tracking.schedule_from(data)
    if "paused" in data:
        done = tracking.pause_page(services(), _me(), page_id, data["paused"], which)
    if "tags" in data:
        done["tags"] = tracking.set_tags(services(), _me(), page_id, data["tags"], which)
    if "every" in data or "cron" in data:
        done.update(tracking.set_tracking_schedule(services(), _me(), page_id, data, which))
    if "name" in data:
        done["name"] = tracking.set_name(services(), _me(), page_id, data["name"], which)
    return jsonify(done)


@bp.route("/pages/<id:page_id>", methods=["DELETE"])
@login_required
def pages_remove(page_id: int) -> Any:
    tracking.remove_page(services(), _me(), page_id, request.args.get("tracking"))
    return "", 204


@bp.route("/pages/<id:page_id>")
@login_required
def pages_history(page_id: int) -> Any:
    return jsonify(tracking.history(services(), _me(), page_id, request.args.get("tracking")))


@bp.route("/pages/<id:page_id>/check", methods=["POST"])
@login_required
def pages_check(page_id: int) -> Any:
    body_as(NoFields, optional=True)
    limit("submit")
    batch_id = tracking.check_now(services(), _me(), page_id)
    return jsonify(
        {"batch": batch_id, "answers": url_for("api.batches_get", batch_id=batch_id)}
    ), 202


@bp.route("/pages/<id:page_id>/diff")
@login_required
def pages_diff(page_id: int) -> Any:
    args = request.args
    return jsonify(
        tracking.diff_data(
            services(), _me(), page_id, args.get("a"), args.get("b"), args.get("tracking")
        )
    )


# -- notifications ------------------------------------------------------------------------------


@bp.route("/channels")
@login_required
def channels_list() -> Any:
    return jsonify({"channels": channels.list_channels(services(), _me())})


@bp.route("/channels", methods=["POST"])
@login_required
def channels_add() -> Any:
    return jsonify(channels.add_channel(services(), _me(), body_as(NewChannel).url)), 201


@bp.route("/channels/<id:channel_id>", methods=["DELETE"])
@login_required
def channels_remove(channel_id: int) -> Any:
    channels.remove_channel(services(), _me(), channel_id)
    return "", 204


@bp.route("/channels/<id:channel_id>/test", methods=["POST"])
@login_required
def channels_test(channel_id: int) -> Any:
    body_as(NoFields, optional=True)
    return jsonify(channels.test_channel(services(), _me(), channel_id))


@bp.route("/notifications")
@login_required
def notifications_list() -> Any:
    return jsonify({"digests": channels.recent_digests(services(), _me())})


@bp.route("/feed")
@login_required
def feed_get() -> Any:
    return jsonify(channels.feed_urls(services(), _me()))


@bp.route("/feed/rotate", methods=["POST"])
@login_required
def feed_rotate() -> Any:
    body_as(NoFields, optional=True)
    return jsonify(channels.feed_urls(services(), _me(), rotate=True))


@bp.route("/quota")
@login_required
def quota_get() -> Any:
    return jsonify(usage(services().batches.sessions, _me().id))


# -- operators ----------------------------------------------------------------------------------


@bp.route("/admin/quota", methods=["POST"])
@admin_required
def admin_quota() -> Any:
    return jsonify(set_user_quota(services().batches.sessions, body_as(QuotaChange)))


@bp.route("/admin/status")
@admin_required
def admin_status() -> Any:
    return jsonify(admin.overview(services()))


@bp.route("/admin/prometheus/targets")
@admin_required
def admin_scrape_targets() -> Any:
    """Prometheus HTTP service discovery: every live master's and agent's /metrics."""
    return jsonify(scrape_targets(services().store))


@bp.route("/admin/nodes", methods=["POST"])
@admin_required
def admin_nodes_add() -> Any:
    data = body_as(NewNode)
    return jsonify({"message": admin.add_node(services(), data.address.strip(), data.slots)}), 201


@bp.route("/admin/nodes/remove", methods=["POST"])
@admin_required
def admin_nodes_remove() -> Any:
    address = body_as(NodeAddress).address
    return jsonify({"message": admin.remove_node(services(), address.strip())})


@bp.route("/admin/runs/<id:run_id>/jobs")
@admin_required
def admin_run_jobs(run_id: int) -> Any:
    query = query_as(RunJobsQuery).model_dump(exclude_none=True)
    return jsonify(admin.run_jobs(services(), run_id, query))


@bp.route("/admin/runs/<id:run_id>/cancel", methods=["POST"])
@admin_required
def admin_run_cancel(run_id: int) -> Any:
    body_as(NoFields, optional=True)
    return jsonify(admin.cancel_run(services(), run_id)), 202


@bp.route("/admin/nodes/drain", methods=["POST"])
@admin_required
def admin_nodes_drain() -> Any:
    address = body_as(NodeAddress).address
    return jsonify({"message": admin.drain_node(services(), address.strip())})


@bp.route("/admin/nodes/reload", methods=["POST"])
@admin_required
def admin_nodes_reload() -> Any:
    address = body_as(NodeReload, optional=True).address
    message = admin.reload_nodes(services(), address.strip() if address is not None else None)
    return jsonify({"message": message}), 202


@bp.route("/admin/cycles", methods=["POST"])
@admin_required
def admin_cycle() -> Any:
    body_as(NoFields, optional=True)
    return jsonify(admin.start_cycle(services())), 202
