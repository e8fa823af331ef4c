"""The OpenAPI 3.1 document of the JSON API (served at ``/api/openapi.json``).

It lists every status an operation can answer: any API request may carry wrong
credentials (401) or too many failed ones (429); a request with a body may be
malformed (400) or not JSON (415); a state-changing request with the session
cookie needs the CSRF header (403). ``tests/test_web_fuzz.py`` holds the server
to it with schemathesis.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter

from . import schemas
from .schemas import (
    CRON_DESCRIPTION,
    EVERY_DESCRIPTION,
    Credentials,
    ExportQuery,
    FamilyChange,
    FamilyJobsQuery,
    FamilyNodes,
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
    TrackingsImport,
    new_tracking_body,
    urls_body,
)
from .settings import WebSettings

_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


#: Statuses any API request may answer: wrong credentials, too many failed ones.
ANY = (401, 429)
#: ... and a request with a JSON body: malformed, not JSON, no CSRF header (session).
WITH_BODY = (400, 401, 403, 415, 429)

#: A tracking's tags, schedule and name, as the API takes (web/schemas.py) and shows them.
_TAGS = TypeAdapter(schemas.Tags).json_schema()
_EVERY = {"type": ["integer", "null"], "description": EVERY_DESCRIPTION}
_CRON = {"type": ["string", "null"], "description": CRON_DESCRIPTION}

REASONS = {
    400: "Malformed or refused input",
    401: "Not logged in, or wrong credentials (session, bearer token or HTTP Basic)",
    403: "Missing CSRF token, operators only, closed, or over a user quota (error "
    "`quota_exceeded`: the whole request was refused, nothing done)",
    404: "No such thing",
    409: "Not in a state that allows it (e.g. a run that is not running)",
    415: "The body must be JSON",
    429: "Rate limit: retry after the Retry-After header's seconds",
}


def _responses(
    ok: int, description: str, schema: dict[str, Any] | None, *errors: int
) -> dict[str, Any]:
    out: dict[str, Any] = {str(ok): {"description": description}}
    if schema is not None:
        out[str(ok)].update(_json(schema))
    for code in sorted({*errors, *ANY}):
        out[str(code)] = {"description": REASONS[code], **_json(_ERROR)}
    return out


def _op(
    summary: str,
    responses: dict[str, Any],
    body: type[BaseModel] | None = None,
    *,
    auth: bool = False,
    params: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:  # the schema of the model the handler validates with
        op["requestBody"] = {"required": True, **_json(schemas.body_schema(body))}
    if auth:
        op["security"] = [{"session": [], "csrf": []}, {"bearer": []}, {"basic": []}]
    if params:
        op["parameters"] = params
    return op


def _path_int(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "integer"}}


def _path_str(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _text(500)}


def _text(most: int, least: int = 1) -> dict[str, Any]:
    return {"type": "string", "minLength": least, "maxLength": most}


def _stream(*events: str) -> dict[str, Any]:
    """An event stream: ``schema`` describes each event (OpenAPI 3.1 reading); its
    ``data`` is one JSON object of the component schema named like the event."""

    def event(name: str) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"const": name},
                "id": {"type": "string"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": f"#/components/schemas/{name.title()}"},
                },
            },
        }

    return {"text/event-stream": {"schema": {"oneOf": [event(e) for e in events]}}}


def _query_int(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": "integer"}}


BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}


FAMILY_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 100},
}
_FAMILY = {"$ref": "#/components/schemas/Family"}
_NODE_RULES = {
    "type": "object",
    "required": ["nodes"],
    "properties": {"nodes": {"type": "array", "items": {"$ref": "#/components/schemas/NodeRule"}}},
}
_NUMBER_OR_NULL = {"type": ["number", "null"], "minimum": 0}
FAMILY_SCHEMAS = {
    "Family": {
        "type": "object",
        "required": ["name", "strategy", "jobs", "nodes"],
        "properties": {
            "name": {"type": "string"},
            "strategy": {"type": "string"},
            "strategy_params": {"type": "object"},
            "schedule": {"type": ["string", "null"]},
            "timeout": _NUMBER_OR_NULL,
            "max_attempts": {"type": ["integer", "null"]},
            "idempotent": {"type": "boolean"},
            "jobs": {"type": "integer"},
            "every_n_cycles": {"type": ["integer", "string", "null"]},
            "min_interval": {"type": ["number", "string", "null"]},
            "priority": {"type": ["integer", "string", "null"]},
            "nodes": {"type": "array", "items": {"$ref": "#/components/schemas/NodeRule"}},
        },
    },
    "NodeRule": {
        "type": "object",
        "required": ["node", "allowed"],
        "properties": {
            "node": {"type": "string"},
            "allowed": {"type": "boolean"},
            "max_slots": {"type": ["integer", "null"]},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    },
}


def _porting_paths() -> dict[str, Any]:
    """Import and export of the user's trackings (``web/porting.py``)."""
    report = {
        "type": "object",
        "required": ["added", "updated", "unchanged", "notes"],
        "properties": {
            "added": {"type": "integer"},
            "updated": {"type": "integer"},
            "unchanged": {"type": "integer"},
            "notes": {
                "type": "array",
                "items": {"type": "string"},
                "description": "what the file had that is not kept (urlwatch's own settings)",
            },
        },
    }
    exported = {
        "application/json": {"schema": {"type": "object"}},
        # A stream of YAML documents (one job each) after a comment: no one schema says it.
        "application/yaml": {},
    }
    return {
        "/api/trackings/import": {
            "post": _op(
                "Import trackings, all or nothing: text is a urlwatch urls.yaml or a JODL "
                "export (format: told from the text when not given). A file with an entry "
                "that cannot be mapped is refused with 400 naming each one (problems: line "
                "or position, message); over your trackings quota, 403; a page you track "
                "through the same filters is updated, not added again",
                _responses(200, "What the import did", report, *WITH_BODY),
                TrackingsImport,
                auth=True,
            )
        },
        "/api/trackings/export": {
            "get": _op(
                "Your trackings as a file: format json (the default) keeps every field; "
                "urlwatch (a urls.yaml) leaves out tags, pauses, triggers and periods, "
                "and says so in a comment at its top",
                {
                    "200": {"description": "The file", "content": exported},
                    **{k: v for k, v in _responses(200, "", None, 400, 401).items() if k != "200"},
                },
                auth=True,
                params=schemas.query_parameters(ExportQuery),
            )
        },
    }


def _family_paths() -> dict[str, Any]:
    """Operators' family settings, node rules and jobs (``web/families.py``)."""
    name = [FAMILY_NAME]
    return {
        "/api/admin/families": {
            "get": _op(
                "Every family with its settings and node rules (operators)",
                _responses(
                    200,
                    "Families",
                    {"type": "object", "properties": {"families": {"type": "array"}}},
                    401,
                    403,
                ),
                auth=True,
            )
        },
        "/api/admin/families/{name}": {
            "get": _op(
                "One family (operators)",
                _responses(200, "The family", _FAMILY, 401, 403, 404),
                auth=True,
                params=name,
            ),
            "patch": _op(
                "Change a family's settings: all given ones at once, or none (operators)",
                _responses(200, "The family as changed", _FAMILY, 404, *WITH_BODY),
                FamilyChange,
                auth=True,
                params=name,
            ),
        },
        "/api/admin/families/{name}/nodes": {
            "get": _op(
                "The nodes a family may (not) run on (operators)",
                _responses(200, "Node rules", _NODE_RULES, 401, 403, 404),
                auth=True,
                params=name,
            ),
            "post": _op(
                "Allow (with a cap and labels) or deny a family on nodes (operators)",
                _responses(200, "Node rules", _NODE_RULES, 404, *WITH_BODY),
                FamilyNodes,
                auth=True,
                params=name,
            ),
        },
        "/api/admin/families/{name}/jobs": {
            "get": _op(
                "A family's jobs, oldest first (operators)",
                _responses(
                    200,
                    "Jobs",
                    {"type": "object", "properties": {"jobs": {"type": "array"}}},
                    400,
                    401,
                    403,
                    404,
                ),
                auth=True,
                params=[FAMILY_NAME, *schemas.query_parameters(FamilyJobsQuery)],
            )
        },
    }


def document(settings: WebSettings) -> dict[str, Any]:
    """The API's description, with this server's limits filled in."""
    urls = urls_body(settings)
    obj = {"type": "object"}
    paths: dict[str, Any] = {
        "/api/": {"get": _op("Links to the API's parts", _responses(200, "Links", obj))},
        "/api/openapi.json": {"get": _op("This document", _responses(200, "OpenAPI", obj))},
        "/api/batches": {
            "post": _op(
                "Submit URLs: cached answers at once, the rest queued",
                _responses(201, "The batch", {"$ref": "#/components/schemas/Batch"}, *WITH_BODY),
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
                    "200": {
                        "description": "Event stream",
                        "content": _stream("result", "complete"),
                    },
                    "404": {"description": "No such batch", **_json(_ERROR)},
                    **{str(c): {"description": REASONS[c], **_json(_ERROR)} for c in ANY},
                },
            }
        },
        "/api/reset": {
            "post": _op(
                "Forget the cached results of these URLs",
                _responses(200, "What was forgotten", obj, *WITH_BODY),
                urls,
                auth=True,
            )
        },
        "/api/users": {
            "post": _op(
                "Sign up: the account's address gets a confirmation link. The answer is the "
                "same whether the address had an account",
                _responses(202, "Check your mailbox", obj, *WITH_BODY),
                Signup,
            )
        },
        "/api/tokens": {
            "post": _op(
                "A bearer token for API requests (no password hash each); logout ends it. "
                "An operator may scope it to families (`families`): it then adds and reads "
                "those families' jobs and nothing else",
                _responses(
                    201,
                    "The token",
                    {
                        "type": "object",
                        "required": ["token", "expires_in"],
                        "properties": {
                            "token": {"type": "string"},
                            "expires_in": {"type": "integer"},
                            "families": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    *WITH_BODY,
                ),
                TokenRequest,
                auth=True,
            )
        },
        "/api/families/{name}/jobs": {
            "post": _op(
                "Add jobs to a family, run by its next cycle: all or none; keys it has are "
                "kept (operators, or a token scoped to the family)",
                _responses(201, "Added", obj, *WITH_BODY),
                Jobs,
                auth=True,
                params=[_path_str("name")],
            )
        },
        "/api/families/{name}/results": {
            "get": _op(
                "Committed results of the family's jobs after a cursor (`after`); pass the "
                "answer's `next` to read on",
                _responses(200, "Results", obj, 400, 401, 403, 404),
                auth=True,
                params=[_path_str("name"), *schemas.query_parameters(ResultsQuery)],
            )
        },
        "/api/queue/{name}/jobs": {
            "post": _op(
                "Queue jobs of a family on demand (a key queued again is updated in place); "
                "`delay`: seconds before they are due",
                _responses(201, "Queued", obj, *WITH_BODY),
                QueuedJobs,
                auth=True,
                params=[_path_str("name")],
            )
        },
        "/api/queue/{name}/jobs/{key}": {
            "get": _op(
                "A queued job's state, attempts and result",
                _responses(200, "The job", obj, 400, 401, 403, 404),
                auth=True,
                params=[_path_str("name"), _path_str("key")],
            )
        },
        "/api/session": {
            "get": _op(
                "Who is logged in, and the session's CSRF token", _responses(200, "Session", obj)
            ),
            "post": _op(
                "Log in (sets the session cookie)",
                _responses(200, "User and CSRF token", obj, *WITH_BODY),
                Credentials,
            ),
            "delete": _op(
                "Log out: every session and token of the user ends",
                _responses(204, "Logged out", None, 403),
            ),
        },
        "/api/pages": {
            "get": _op(
                "Your tracked pages (?q=WORDS: only those whose URL, title or tags hold "
                "every word, any case)",
                _responses(
                    200,
                    "Pages",
                    {
                        "type": "object",
                        "properties": {
                            "pages": {
                                "type": "array",
                                "items": {"$ref": "#/components/schemas/TrackedPage"},
                            }
                        },
                    },
                    401,
                ),
                auth=True,
                params=[{"name": "q", "in": "query", "required": False, "schema": _text(200, 0)}],
            ),
            "post": _op(
                "Track a page through a view: a selector (CSS, XPath, JSONPath), line "
                "filters and a trigger, all optional; tracking it through another view adds "
                "a tracking (rendered in a browser first with browser: true, for pages "
                "built by JavaScript). A bad expression is refused with 400 naming it",
                _responses(201, "Tracked", obj, *WITH_BODY),
                new_tracking_body(settings),
                auth=True,
            ),
        },
        "/api/pages/{page_id}": {
            "get": _op(
                "A tracked page's history (snapshots, newest first) through one of your "
                "views of it (?tracking=ID; default: the first)",
                _responses(200, "History", obj, 400, 401, 404),
                auth=True,
                params=[_path_int("page_id"), _query_int("tracking")],
            ),
            "patch": _op(
                "Pause (paused: true) or resume (paused: false) your trackings of a page "
                "(only the tracking ?tracking=ID, if given), replace the tags of one "
                "(?tracking=ID, default: the first), set their schedule (every, cron; "
                "both null: the default) or name one (name; null: the page's title). A "
                "paused tracking keeps its history and gets no digest and its schedule "
                "does not count; a page whose trackings are all paused is not fetched",
                _responses(200, "Changed", obj, *WITH_BODY, 404),
                TrackingChange,
                auth=True,
                params=[_path_int("page_id"), _query_int("tracking")],
            ),
            "delete": _op(
                "Stop tracking a page (only through the tracking ?tracking=ID, if given)",
                _responses(204, "Removed", None, 400, 401, 403, 404),
                auth=True,
                params=[_path_int("page_id"), _query_int("tracking")],
            ),
        },
        "/api/pages/{page_id}/check": {
            "post": _op(
                "Fetch a tracked page now, bypassing the result cache (as the page list's "
                "Check now): the batch whose answers show the result; a view without a "
                "baseline gets one now",
                _responses(202, "The batch", obj, *WITH_BODY, 404),
                NoFields,
                auth=True,
                params=[_path_int("page_id")],
            ),
        },
        "/api/pages/{page_id}/diff": {
            "get": _op(
                "Inline and side-by-side diff of two snapshots (default: the newest two)",
                _responses(200, "Diff", obj, 400, 401, 404),
                auth=True,
                params=[
                    _path_int("page_id"),
                    _query_int("a"),
                    _query_int("b"),
                    _query_int("tracking"),
                ],
            )
        },
        "/api/channels": {
            "get": _op(
                "Your notification channels (Apprise URLs, secrets masked)",
                _responses(200, "Channels", obj, 401),
                auth=True,
            ),
            "post": _op(
                "Add a notification channel: an Apprise URL (mailto://, ntfy://, slack://, "
                "json://, ...); a private address is refused unless JODL_CHANNEL_ALLOW allows it",
                _responses(201, "Added (its URL masked)", obj, *WITH_BODY),
                NewChannel,
                auth=True,
            ),
        },
        "/api/channels/{channel_id}": {
            "delete": _op(
                "Remove a notification channel",
                _responses(204, "Removed", None, 401, 403, 404),
                auth=True,
                params=[_path_int("channel_id")],
            ),
        },
        "/api/channels/{channel_id}/test": {
            "post": _op(
                "Send a test message to a channel now (ok false and the reason if it failed)",
                _responses(200, "What happened", obj, *WITH_BODY, 404),
                NoFields,
                auth=True,
                params=[_path_int("channel_id")],
            ),
        },
        "/api/notifications": {
            "get": _op(
                "Your recent digests: the e-mail's state and each channel delivery's",
                _responses(200, "Digests, newest first", obj, 401),
                auth=True,
            ),
        },
        "/api/feed": {
            "get": _op(
                "The secret URL of your Atom feed of changes (no login needed to read it), "
                "and under tags the URL of the feed of each of your tags (the same secret)",
                _responses(200, "The feed's URL", obj, 401),
                auth=True,
            ),
        },
        "/api/feed/rotate": {
            "post": _op(
                "Give your feed a new secret URL; the old one answers 404 from now on",
                _responses(200, "The feed's new URL", obj, *WITH_BODY),
                NoFields,
                auth=True,
            ),
        },
        "/api/quota": {
            "get": _op(
                "Your quotas (0: no limit) and what you used of them",
                _responses(200, "Limits and usage", {"$ref": "#/components/schemas/Quota"}, 401),
                auth=True,
            )
        },
        "/api/admin/quota": {
            "post": _op(
                "Set a user's quotas (operators): null puts one back to its default, 0 is "
                "no limit; fields left out are unchanged",
                _responses(
                    200,
                    "The user's limits and usage",
                    {"$ref": "#/components/schemas/Quota"},
                    404,
                    *WITH_BODY,
                ),
                QuotaChange,
                auth=True,
            )
        },
        "/api/admin/status": {
            "get": _op(
                "Nodes, queue counts, runs with progress (operators)",
                _responses(200, "Status", obj, 401, 403),
                auth=True,
            )
        },
        "/api/admin/prometheus/targets": {
            "get": _op(
                "Every live master's and agent's /metrics address, as Prometheus HTTP "
                "service discovery (http_sd_configs) target groups (operators)",
                _responses(200, "Target groups", {"type": "array"}, 401, 403),
                auth=True,
            )
        },
        "/api/admin/events": {
            "get": {
                "summary": "The status every second as Server-Sent Events (operators)",
                "security": [{"session": []}, {"bearer": []}, {"basic": []}],
                "responses": {
                    "200": {"description": "Event stream", "content": _stream("status")},
                    **{
                        str(c): {"description": REASONS[c], **_json(_ERROR)}
                        for c in (401, 403, 429)
                    },
                },
            }
        },
        "/api/admin/nodes": {
            "post": _op(
                "Add (or bring back) an agent node",
                _responses(201, "Added", obj, *WITH_BODY),
                NewNode,
                auth=True,
            )
        },
        "/api/admin/nodes/remove": {
            "post": _op(
                "Remove an agent node",
                _responses(200, "Removed", obj, 404, *WITH_BODY),
                NodeAddress,
                auth=True,
            )
        },
        "/api/admin/runs/{run_id}/jobs": {
            "get": _op(
                "A run's attempts in the order they were logged, a page at a time: key, "
                "node, attempt, state, duration, result or error (cut); filter by state and "
                "by text in the key; `next` is the `after` of the following page",
                _responses(200, "Jobs", obj, 400, 401, 403, 404),
                auth=True,
                params=[_path_int("run_id"), *schemas.query_parameters(RunJobsQuery)],
            )
        },
        "/api/admin/runs/{run_id}/cancel": {
            "post": _op(
                "Cancel a running run (asked of the running master, or recorded at once)",
                _responses(202, "Cancelled or asked", obj, *WITH_BODY, 404, 409),
                NoFields,
                auth=True,
                params=[_path_int("run_id")],
            )
        },
        "/api/admin/nodes/drain": {
            "post": _op(
                "Drain an agent node: nothing new goes there; its agent finishes what it "
                "has, hands the results over, exits, and the node is removed",
                _responses(200, "Draining", obj, 404, *WITH_BODY),
                NodeAddress,
                auth=True,
            )
        },
        "/api/admin/nodes/reload": {
            "post": _op(
                "Make agents read their installed families again (one node, or every live "
                "node's without an address); the running master relays it; held results "
                "are kept",
                _responses(202, "Asked", obj, 404, *WITH_BODY),
                NodeReload,
                auth=True,
            )
        },
        "/api/admin/cycles": {
            "post": _op(
                "Request an application cycle now (a running master starts it): it checks "
                "the pages due by their trackings' schedules ('Check now' on a page in the "
                "web UI fetches that page at once)",
                _responses(202, "Requested", obj, *WITH_BODY),
                NoFields,
                auth=True,
            )
        },
        **_family_paths(),
        **_porting_paths(),
        "/healthz": {
            "get": _op(
                "Health: the database answers",
                {
                    "200": {"description": "Healthy", **_json(obj)},
                    "503": {"description": "The database does not answer", **_json(obj)},
                },
            )
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (JODL_WEB_METRICS_ACCESS: by default clients "
                "on this machine and operators)",
                "responses": {
                    "200": {"description": "Text exposition format"},
                    "403": {"description": REASONS[403], **_json(_ERROR)},
                },
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
                "bearer": {"type": "http", "scheme": "bearer"},
                "basic": {"type": "http", "scheme": "basic"},
            },
            "schemas": {
                **schemas.components(schemas.models(settings)),
                **FAMILY_SCHEMAS,
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                },
                "TrackedPage": {
                    "type": "object",
                    "description": "A page you track, its last check and how it is read",
                    "properties": {
                        "id": {"type": "integer"},
                        "tracking": {
                            "type": "integer",
                            "description": "this tracking (a view of the page): ?tracking=",
                        },
                        "url": {"type": "string"},
                        "selector": {"type": ["string", "null"]},
                        "filters": {
                            "type": "object",
                            "description": "selector, include, exclude, ignore, trigger",
                        },
                        "view": {"type": "string", "description": "the filters in words"},
                        "problem": {
                            "type": ["string", "null"],
                            "description": "why the view's last good check gave no text "
                            "(a selector that matches nothing, filters that leave no line)",
                        },
                        "browser": {
                            "type": "boolean",
                            "description": "you asked for the page to be rendered in a browser",
                        },
                        "rendered": {
                            "type": "boolean",
                            "description": "the page is rendered (one of its trackers asked)",
                        },
                        "script_page": {
                            "type": "boolean",
                            "description": "fetched without the browser, the page showed "
                            "scripts and almost no text: it builds its text with JavaScript",
                        },
                        "refused_requests": {
                            "type": ["integer", "null"],
                            "description": "requests of the page the last rendering refused",
                        },
                        "note": {"type": ["string", "null"]},
                        "last_checked_at": {"type": ["string", "null"]},
                        "last_changed_at": {"type": ["string", "null"]},
                        "next_check_at": {
                            "type": ["string", "null"],
                            "description": "the page's due time (the earliest among its "
                            "active trackings'); null when paused or when no schedule "
                            "checks it",
                        },
                        "every": _EVERY,
                        "cron": _CRON,
                        "schedule": {
                            "type": "string",
                            "description": "the schedule in words: every 15 min, cron …, "
                            "default schedule",
                        },
                        "paused": {
                            "type": "boolean",
                            "description": "paused: no checks for you, no digests",
                        },
                        "name": {
                            "type": ["string", "null"],
                            "description": "your name for the tracking (null: the title)",
                        },
                        "tags": _TAGS,
                    },
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
                "Quota": {
                    "type": "object",
                    "description": "A user's quotas in effect (0: no limit) and their use",
                    "required": ["limits", "used"],
                    "properties": {
                        "email": {"type": "string"},
                        "limits": {
                            "type": "object",
                            "properties": {
                                name: {"type": "integer", "minimum": 0}
                                for name in ("trackings", "urls_per_day", "batch")
                            },
                        },
                        "used": {
                            "type": "object",
                            "properties": {
                                "trackings": {"type": "integer"},
                                "urls_per_day": {"type": "integer"},
                            },
                        },
                    },
                },
                "Complete": {
                    "type": "object",
                    "description": "The last event of a batch: every item is answered",
                    "required": ["total"],
                    "properties": {"total": {"type": "integer"}},
                },
                "Status": {
                    "type": "object",
                    "description": "One `status` event: the operators' overview",
                    "required": ["nodes"],
                    "properties": {"nodes": {"type": "array"}},
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
