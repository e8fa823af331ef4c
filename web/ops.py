"""Health check and Prometheus metrics of the web process."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import Forbidden

from . import queries
from .auth import current_user
from .services import services

#: Client addresses of this machine.
LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})

bp = Blueprint("ops", __name__)


@bp.route("/healthz")
def healthz() -> Any:
    """200 when the database answers, 503 otherwise (for load balancers and ``jodl up``)."""
    svc = services()
    try:
        queries.ping(svc.engine)
    except SQLAlchemyError as exc:
        reason = str(exc).splitlines()[0][:200]
        return jsonify({"status": "error", "database": reason}), 503
    return jsonify({"status": "ok", "database": "ok"})


def _may_read_metrics(access: str) -> bool:
    """Whether this request may read /metrics under JODL_WEB_METRICS_ACCESS."""
    if access == "public":
        return True
    user = current_user()
    if user is not None and user.is_admin:
        return True
    if access == "operators":
        return False
    # "loopback": a scraper on this machine (not through a proxy: then it names another).
    return request.remote_addr in LOOPBACK and "X-Forwarded-For" not in request.headers


@bp.route("/metrics")
def metrics() -> Response:
    svc = services()
    if not _may_read_metrics(svc.settings.web_metrics_access):
        raise Forbidden(
            "metrics are for clients on this machine and operators (JODL_WEB_METRICS_ACCESS)"
        )
    try:
        body = svc.metrics.render(svc.engine)
    except SQLAlchemyError:
        body = svc.metrics.render(None) + "# database unavailable\n"
    return Response(body, mimetype="text/plain", content_type="text/plain; version=0.0.4")
