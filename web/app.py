"""The Flask application factory (the services every view shares: :mod:`web.services`).

``create_app(settings)`` builds the app on one database: blueprints ``ui``
(submit, batches, reset), ``auth`` (sign up, log in, log out), ``tracking``
(tracked pages, history, diffs), ``channels``, ``feeds``, ``admin`` (operator
views), ``families``, ``porting``, ``mailsink``, ``stream`` (event streams),
``api`` (JSON API, OpenAPI document; the families' and trackings' API nested in it)
and ``ops`` (``/healthz``, ``/metrics``). Every response carries the security headers; every
state-changing form request must carry the session's CSRF token; every error is
answered as a page (or JSON under ``/api``) and never as a bare traceback.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from flask import Flask, Response, g, jsonify, render_template, request
from sqlalchemy import Engine
from werkzeug.exceptions import (
    BadRequest,
    Forbidden,
    HTTPException,
    MethodNotAllowed,
    SecurityError,
)
from werkzeug.middleware.proxy_fix import ProxyFix

from crawler_app import AppSettings
from jodl.log import ResultWatch, Store, make_engine
from jodl.queue import Queue

from . import (
    admin,
    api,
    auth,
    channels,
    families,
    feeds,
    mailsink,
    ops,
    porting,
    stream,
    tracking,
    ui,
)
from .auth import ADDRESS_LOGIN_FACTOR, LOGIN_WINDOW_MINUTES
from .batch import Batches
from .fanout import Fanout
from .metrics import Metrics
from .security import (
    CSRF_FIELD,
    CSRF_HEADER,
    Limits,
    RateLimiter,
    add_headers,
    csrf_token,
    csrf_valid,
)
from .services import IdConverter, Services, is_api, services
from .settings import WebSettings
from .slots import StreamSlots
from .timefmt import when

log = logging.getLogger("web")

# The API's other parts nest under its blueprint (``/api``): its guard (JSON bodies, the
# session's CSRF token) runs before their views as before the API's own.
api.bp.register_blueprint(families.api_bp)
api.bp.register_blueprint(porting.api_bp)

#: The blueprints of every app, the API's with its nested ones.
BLUEPRINTS = (
    *(m.bp for m in (ui, auth, tracking, channels, feeds, admin, stream, api, ops, mailsink)),
    families.bp,
    porting.bp,
)

#: Largest request body accepted (bytes): a batch of URLs fits many times over.
MAX_BODY = 1024 * 1024


def create_app(
    settings: WebSettings | None = None,
    *,
    engine: Engine | None = None,
) -> Flask:
    """Build the web app for ``settings`` (default: from ``JODL_*`` variables) on
    ``engine`` (default: one pooled for the server's threads)."""
    settings = settings or WebSettings.from_env()
    app = Flask(__name__)
    secure = settings.web_secure_cookies
    app.config.update(
        SECRET_KEY=settings.secret_key(),
        SESSION_COOKIE_NAME="__Host-jodl" if secure else "jodl_session",
        SESSION_COOKIE_SECURE=secure,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        PERMANENT_SESSION_LIFETIME=14 * 24 * 3600,
        MAX_CONTENT_LENGTH=MAX_BODY,
        MAX_FORM_MEMORY_SIZE=MAX_BODY,
        JSON_SORT_KEYS=False,
        # Host names this site answers to: a rebinding name pointing at it gets a 400.
        TRUSTED_HOSTS=settings.trusted_hosts(),
    )
    if settings.web_proxies:
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=settings.web_proxies, x_proto=settings.web_proxies
        )
    app.url_map.converters["id"] = IdConverter
    if engine is None:
        engine = _engine(settings)
    app.extensions["jodl"] = _services(settings, engine)
    _template_helpers(app)

    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    app.before_request(_check_csrf)
    app.before_request(auth.load_user)
    app.after_request(_after)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
    return app


def _engine(settings: WebSettings) -> Engine:
    """The database engine: streams hold a pooled connection only while they look, so
    the pool is sized for the server's threads."""
    extra: dict[str, Any] = {}
    if not settings.database_url.startswith("sqlite"):
        extra = {"pool_size": 10, "max_overflow": settings.web_threads}
    return make_engine(settings.database_url, **extra)


def _services(settings: WebSettings, engine: Engine) -> Services:
    """The services the views share (:func:`web.services.services`), on ``engine``."""
    store = Store(engine)
    queue = Queue(store)
    stopping = threading.Event()
    results = ResultWatch(engine, stopping)
    burst = settings.web_submit_burst
    return Services(
        allow_users=AppSettings.from_env().allow_users(),
        settings=settings,
        engine=engine,
        store=store,
        queue=queue,
        batches=Batches(engine, settings, queue),
        limits=Limits(
            users=RateLimiter(settings.web_submit_per_minute, burst),
            anonymous=RateLimiter(settings.web_anonymous_per_minute, settings.web_anonymous_burst),
            login_pair=RateLimiter(burst / LOGIN_WINDOW_MINUTES, burst),
            login_address=RateLimiter(
                burst * ADDRESS_LOGIN_FACTOR / LOGIN_WINDOW_MINUTES, burst * ADDRESS_LOGIN_FACTOR
            ),
        ),
        metrics=Metrics(),
        streams=StreamSlots(
            settings.web_max_streams,
            settings.web_streams_per_client,
            settings.web_operator_streams,
        ),
        stopping=stopping,
        results=results,
        fanout=Fanout(engine, results, stopping, settings.web_stream_poll),
    )


def _template_helpers(app: Flask) -> None:
    """Every template escapes, and has the CSRF token, the time filter and the user."""
    app.jinja_env.autoescape = True  # every template, whatever its file name
    app.jinja_env.globals["csrf_token"] = csrf_token
    app.jinja_env.globals["csrf_field"] = CSRF_FIELD
    app.jinja_env.filters["when"] = when
    app.context_processor(lambda: {"user": g.get("user")})


def _check_csrf() -> None:
    """Refuse a state-changing request of the HTML views without the session's token."""
    if request.method in ("GET", "HEAD", "OPTIONS") or is_api():
        return  # the API checks its own (session-authenticated requests only)
    if request.routing_exception is not None:
        return  # no such page or method: answered 404/405 as such (nothing changes)
    token = request.form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
    if not csrf_valid(token):
        raise Forbidden("the form expired or did not come from this site: reload it and retry")


def _after(response: Response) -> Response:
    svc = services()
    svc.metrics.inc("jodl_web_requests_total", code=f"{response.status_code // 100}xx")
    if request.endpoint and not request.endpoint.startswith("static"):
        response.headers.setdefault("Cache-Control", "no-store")
    return add_headers(response, hsts=svc.settings.web_secure_cookies)


def _http_error(exc: HTTPException) -> Any:
    code = exc.code or 500
    message = exc.description or exc.name
    if isinstance(exc, BadRequest) and code == 400 and "CSRF" in str(message):
        message = "bad request"
    headers = {}
    if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
        headers["Allow"] = ", ".join(sorted(exc.valid_methods))
    if code == 429 and getattr(exc, "retry_after", None):
        headers["Retry-After"] = str(exc.retry_after)  # type: ignore[attr-defined]
    if code == 401 and is_api():
        headers["WWW-Authenticate"] = 'Basic realm="jodl", charset="UTF-8", Bearer realm="jodl"'
    if exc.response is not None and code in (301, 302, 303, 307, 308):
        return exc.response
    if is_api() or request.accept_mimetypes.best == "application/json":
        return (
            jsonify({"error": exc.name.lower().replace(" ", "_"), "message": message}),
            code,
            headers,
        )
    if isinstance(exc, SecurityError):
        # A Host this site does not answer to (JODL_WEB_TRUSTED_HOSTS): no URL can be
        # built for the request, so no page either (its links); one plain line.
        return Response(f"{code} {exc.name}: {message}\n", code, headers, mimetype="text/plain")
    return (
        render_template("error.html", code=code, name=exc.name, message=message),
        code,
        headers,
    )


def _unexpected(exc: Exception) -> Any:
    if isinstance(exc, HTTPException):
        return _http_error(exc)
    log.exception("unexpected error on %s %s", request.method, request.path)
    g.pop("user", None)
    if is_api():
        return jsonify({"error": "internal_error", "message": "unexpected error; see the log"}), 500
    return (
        render_template(
            "error.html", code=500, name="Internal error", message="Unexpected error; see the log."
        ),
        500,
    )
