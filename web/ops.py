"""Health check and Prometheus metrics of the web process."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from .app import services

bp = Blueprint("ops", __name__)


@bp.route("/healthz")
def healthz() -> Any:
    """200 when the database answers, 503 otherwise (for load balancers and ``jodl up``)."""
    svc = services()
    try:
        with svc.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        reason = str(exc).splitlines()[0][:200]
        return jsonify({"status": "error", "database": reason}), 503
    return jsonify({"status": "ok", "database": "ok"})


@bp.route("/metrics")
def metrics() -> Response:
    svc = services()
    try:
        body = svc.metrics.render(svc.engine)
    except SQLAlchemyError:
        body = svc.metrics.render(None) + "# database unavailable\n"
    return Response(body, mimetype="text/plain", content_type="text/plain; version=0.0.4")
