"""The OpenAPI 3.1 document of the JSON API (served at ``/api/openapi.json``)."""

from __future__ import annotations

from typing import Any

from .settings import WebSettings

_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _responses(
    ok: int, description: str, schema: dict[str, Any] | None, *errors: int
) -> dict[str, Any]:
    out: dict[str, Any] = {str(ok): {"description": description}}
    if schema is not None:
        out[str(ok)].update(_json(schema))
    reasons = {
        400: "Malformed or refused input",
        401: "Not logged in (session or HTTP Basic)",
        403: "Missing CSRF token, or operators only",
        404: "No such thing",
        415: "The body must be JSON",
        429: "Rate limit: retry after the Retry-After header's seconds",
    }
    for code in errors:
        out[str(code)] = {"description": reasons[code], **_json(_ERROR)}
    return out


def _op(
    summary: str,
    responses: dict[str, Any],
    body: dict[str, Any] | None = None,
    *,
    auth: bool = False,
    params: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, **_json(body)}
    if auth:
        op["security"] = [{"session": [], "csrf": []}, {"basic": []}]
    if params:
        op["parameters"] = params
    return op


def _path_int(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "integer"}}


def _query_int(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": "integer"}}


BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}


def document(settings: WebSettings) -> dict[str, Any]:
    """The API's description, with this server's limits filled in."""
    urls = {
        "type": "object",
        "required": ["urls"],
        "properties": {
            "urls": {
                "type": "array",
                "items": {"type": "string", "maxLength": settings.web_url_max},
                "minItems": 1,
                "maxItems": settings.web_batch_max,
            }
        },
    }
    credentials = {
        "type": "object",
        "required": ["email", "password"],
        "properties": {"email": {"type": "string"}, "password": {"type": "string"}},
    }
    obj = {"type": "object"}
    stream = {"text/event-stream": {"schema": {"type": "string"}}}
    paths: dict[str, Any] = {
        "/api/": {"get": _op("Links to the API's parts", _responses(200, "Links", obj))},
        "/api/openapi.json": {"get": _op("This document", _responses(200, "OpenAPI", obj))},
        "/api/batches": {
            "post": _op(
                "Submit URLs: cached answers at once, the rest queued",
                _responses(201, "The batch", {"$ref": "#/components/schemas/Batch"}, 400, 415, 429),
                urls,
            )
        },
        "/api/batches/{batch_id}": {
            "get": _op(
                "A batch's answers so far",
                _responses(200, "Answers", obj, 404),
                params=[BATCH_ID],
            )
        },
        "/api/batches/{batch_id}/events": {
            "get": {
                "summary": "A batch's results as Server-Sent Events in completion order "
                "(event `result`, last event `complete`); resume with Last-Event-ID",
                "parameters": [
                    BATCH_ID,
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {"description": "Event stream", "content": stream},
                    "404": {"description": "No such batch", **_json(_ERROR)},
                },
            }
        },
        "/api/reset": {
            "post": _op(
                "Forget the cached results of these URLs",
                _responses(200, "What was forgotten", obj, 400, 401, 403, 415),
                urls,
                auth=True,
            )
        },
        "/api/users": {
            "post": _op(
                "Sign up", _responses(201, "The new user", obj, 400, 403, 415, 429), credentials
            )
        },
        "/api/session": {
            "get": _op(
                "Who is logged in, and the session's CSRF token", _responses(200, "Session", obj)
            ),
            "post": _op(
                "Log in (sets the session cookie)",
                _responses(200, "User and CSRF token", obj, 400, 401, 415, 429),
                credentials,
            ),
            "delete": _op("Log out", _responses(204, "Logged out", None, 403)),
        },
        "/api/pages": {
            "get": _op("Your tracked pages", _responses(200, "Pages", obj, 401), auth=True),
            "post": _op(
                "Track a page (optionally only what a CSS selector picks)",
                _responses(201, "Tracked", obj, 400, 401, 403, 415),
                {
                    "type": "object",
                    "required": ["url"],
                    "properties": {
                        "url": {"type": "string"},
                        "selector": {"type": ["string", "null"]},
                    },
                },
                auth=True,
            ),
        },
        "/api/pages/{page_id}": {
            "get": _op(
                "A tracked page's history (snapshots, newest first)",
                _responses(200, "History", obj, 401, 404),
                auth=True,
                params=[_path_int("page_id")],
            ),
            "delete": _op(
                "Stop tracking a page",
                _responses(204, "Removed", None, 401, 403, 404),
                auth=True,
                params=[_path_int("page_id")],
            ),
        },
        "/api/pages/{page_id}/diff": {
            "get": _op(
                "Inline and side-by-side diff of two snapshots (default: the newest two)",
                _responses(200, "Diff", obj, 400, 401, 404),
                auth=True,
                params=[_path_int("page_id"), _query_int("a"), _query_int("b")],
            )
        },
        "/api/admin/status": {
            "get": _op(
                "Nodes, queue counts, runs with progress (operators)",
                _responses(200, "Status", obj, 401, 403),
                auth=True,
            )
        },
        "/api/admin/events": {
            "get": {
                "summary": "The status every second as Server-Sent Events (operators)",
                "security": [{"session": []}, {"basic": []}],
                "responses": {"200": {"description": "Event stream", "content": stream}},
            }
        },
        "/api/admin/nodes": {
            "post": _op(
                "Add (or bring back) an agent node",
                _responses(201, "Added", obj, 400, 401, 403, 415),
                {
                    "type": "object",
                    "required": ["address"],
                    "properties": {
                        "address": {"type": "string", "description": "HOST:PORT"},
                        "slots": {"type": "integer", "minimum": 1},
                    },
                },
                auth=True,
            )
        },
        "/api/admin/nodes/remove": {
            "post": _op(
                "Remove an agent node",
                _responses(200, "Removed", obj, 400, 401, 403, 404, 415),
                {
                    "type": "object",
                    "required": ["address"],
                    "properties": {"address": {"type": "string"}},
                },
                auth=True,
            )
        },
        "/api/admin/cycles": {
            "post": _op(
                "Request an application cycle now (a running master starts it)",
                _responses(202, "Requested", obj, 400, 401, 403),
                {"type": "object"},
                auth=True,
            )
        },
        "/healthz": {"get": _op("Health: the database answers", _responses(200, "Healthy", obj))},
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "Text exposition format"}},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "JODL web API",
            "version": "1",
            "description": "Submit URLs and stream their results; manage tracked pages; "
            "operate the cluster. State-changing requests send JSON; with the session "
            "cookie they also send the X-CSRF-Token header.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "session": {"type": "apiKey", "in": "cookie", "name": "__Host-jodl"},
                "csrf": {"type": "apiKey", "in": "header", "name": "X-CSRF-Token"},
                "basic": {"type": "http", "scheme": "basic"},
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                },
                "Batch": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "size": {"type": "integer"},
                        "items": {"type": "array", "items": obj},
                        "events": {"type": "string"},
                    },
                },
                "Result": {
                    "type": "object",
                    "description": "One `result` event",
                    "properties": {
                        "position": {"type": "integer"},
                        "url": {"type": "string"},
                        "ok": {"type": "boolean"},
                        "cached": {"type": "boolean"},
                        "status": {"type": ["integer", "null"]},
                        "final_url": {"type": ["string", "null"]},
                        "title": {"type": ["string", "null"]},
                        "size": {"type": ["integer", "null"]},
                        "fingerprint": {"type": ["string", "null"]},
                        "changed": {"type": ["boolean", "null"]},
                        "excerpt": {"type": ["string", "null"]},
                        "error": {"type": ["string", "null"]},
                        "checked_at": {"type": ["string", "null"]},
                    },
                },
            },
        },
    }
