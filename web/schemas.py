"""The JSON API's request bodies, declared once: the handlers validate through these
models and ``/api/openapi.json`` shows their JSON Schemas (web/openapi.py), so what
the document promises and what the server checks cannot drift apart.

Every body is strict (``true`` is not ``1``, ``"5"`` is not ``5``) and refuses fields
it does not know; a refused one is one 400 line naming the field (web/refusals.py).
Bounds that depend on the operator's settings (the checking
interval, a cron's firing rate, the visitor's batch size) are checked by the code
after these models, and the field's description says so; a model whose bounds come
from :class:`~web.settings.WebSettings` is built for them (:func:`urls_body`,
:func:`new_tracking_body`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    create_model,
    model_validator,
)

from crawler_app import CRON_LENGTH, FORMATS, MAX_TAGS, NAME_LENGTH, TAG_LENGTH
from jodl.admin.families import JOB_STATES, MAX_JOBS_LISTED
from jodl.log import ExecState

from .settings import WebSettings

#: Where the document keeps the models' schemas (and a $ref finds them).
REF_TEMPLATE = "#/components/schemas/{model}"
#: Largest whole number a quota or a priority holds (a 32-bit column).
INT32_MAX = 2**31 - 1
#: Jobs one request may add at most (a larger set: several requests).
MAX_JOBS = 10_000
#: Longest job key accepted.
MAX_KEY = 500
#: Latest a queued job may be due: a year from now, in seconds.
MAX_DELAY = 366 * 86400
#: The states a run's attempt is listed in (a sent one has no row until its outcome).
LISTED_STATES = (
    ExecState.DONE,
    ExecState.FAILED,
    ExecState.LOST,
    ExecState.TAKEN_BACK,
    ExecState.CANCELLED,
)


class Input(BaseModel):
    """What a request gives: a body or query parameters.

    ``hints`` says, per field, what goes there: the refusal of a value of the wrong
    kind (or a missing one) names the field with its hint; a value out of bounds is
    refused with the bound it broke. ``unknown_field`` is what a field the body does
    not have is called."""

    hints: ClassVar[dict[str, str]] = {}
    unknown_field: ClassVar[str] = "not a field of this request"


class Body(Input):
    """A request body: strict types, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Query(Input):
    """Query parameters: text read as the field's type, an empty value taken as one
    not given, parameters the model does not name ignored (a client's cache buster)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _given(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v != ""}
        return data


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def unchanged(**kwargs: Any) -> Any:
    """A field that, left out, changes nothing (PATCH-like bodies); it takes no null
    unless its type says so, and the document shows no default for it."""
    return Field(None, json_schema_extra=_no_default, **kwargs)


def _text(most: int, least: int = 1, **kwargs: Any) -> Any:
    return Field(min_length=least, max_length=most, **kwargs)


# -- shared field types --------------------------------------------------------------------------

#: One tag: stripped and lower-cased, then checked.
Tag = Annotated[
    str,
    StringConstraints(
        strip_whitespace=True, to_lower=True, pattern=rf"^[A-Za-z0-9_.-]{{1,{TAG_LENGTH}}}$"
    ),
]
Tags = Annotated[
    list[Tag],
    Field(
        max_length=MAX_TAGS, description="labels of this tracking (lower-cased); searched by ?q="
    ),
]
EVERY_DESCRIPTION = (
    "check the page every this many seconds (900: 15 minutes), within the operator's "
    "JODL_CHECK_EVERY_MIN/_MAX (checked after this schema); null with cron null: the "
    "operator's default schedule. The page is checked at the shortest schedule among "
    "its active trackings, once per due time"
)
CRON_DESCRIPTION = (
    "or check it on this cron expression (MIN HOUR DAY MONTH WEEKDAY, the server's local "
    "time), firing no more often than the operator's minimum interval (checked after "
    "this schema)"
)
#: What the schedule fields take, when they are refused for their kind.
SCHEDULE_HINTS = {
    "every": "whole seconds, e.g. 900 for 15 minutes (or null)",
    "cron": "five cron fields as text, e.g. '*/30 * * * *' (or null)",
}
TAG_HINT = (
    f"a list of at most {MAX_TAGS} words: ASCII letters, digits, _ . - only, "
    f"1 to {TAG_LENGTH} characters each"
)
Lines = Annotated[
    list[str] | str | None,
    Field(description="rules as a list, or as text with one rule per line"),
]
Address = Annotated[str, _text(300, description="HOST:PORT")]


# -- batches and accounts --------------------------------------------------------------------------


class _UrlList(Body):
    hints = {"urls": 'a list of URL strings, e.g. {"urls": ["https://example.org/"]}'}


def urls_body(settings: WebSettings) -> type[Body]:
    """The body of ``POST /api/batches`` and ``/api/reset`` under ``settings``' limits."""
    return _urls_body(
        settings.web_batch_max,
        min(settings.web_batch_max, settings.web_anonymous_batch_max),
        settings.web_url_max,
    )


@functools.lru_cache(maxsize=16)
def _urls_body(most: int, anonymous_most: int, url_most: int) -> type[Body]:
    # An item of another type is refused on its own (an item with an error), as is a
    # bad URL: the rest of the batch goes ahead, so items are not checked here.
    url = Annotated[
        Any,
        WithJsonSchema(
            {
                "type": "string",
                "description": "A URL. One that is empty, malformed, not http(s) or longer "
                f"than {url_most} characters is refused on its own (an item with an "
                "error); the rest of the batch goes ahead",
            }
        ),
    ]
    field = Field(
        max_length=most,
        description=f"At least one; at most {anonymous_most} for visitors who are not "
        "logged in (checked after this schema)",
    )
    return create_model("Urls", __base__=_UrlList, urls=(list[url], field))


class Signup(Body):
    email: str = _text(320)
    password: str = _text(200, 8)
    hints = {"email": "an e-mail address", "password": "text"}


class Credentials(Body):
    email: str = _text(320)
    password: str = _text(200)
    hints = {"email": "an e-mail address", "password": "text"}


class TokenRequest(Body):
    families: list[Annotated[str, _text(200)]] | None = Field(
        None,
        min_length=1,
        description="operators only: a token for these families' jobs and nothing else",
    )
    hints = {"families": "a non-empty list of family names"}


# -- jobs over HTTP -----------------------------------------------------------------------------


class Job(Body):
    key: str = _text(MAX_KEY)
    payload: dict[str, Any] = Field(default_factory=dict)


class Jobs(Body):
    jobs: list[Job] = Field(min_length=1, max_length=MAX_JOBS)


class QueuedJobs(Jobs):
    delay: float = Field(0, ge=0, le=MAX_DELAY, description="seconds before they are due")


# -- tracked pages ------------------------------------------------------------------------------


class _TrackingFields(Body):
    selector: str | None = Field(
        None,
        description="CSS selector; XPath when it starts with / or ( or xpath:, JSONPath "
        "when it starts with $ or jsonpath:",
    )
    xpath: str | None = None
    jsonpath: str | None = None
    include: Lines = Field(None, description="regular expressions: keep only lines matching one")
    exclude: Lines = Field(None, description="regular expressions: drop lines matching one")
    ignore: Lines = Field(
        None,
        description="texts: drop lines containing one, any case (re:REGEX for a regular "
        "expression)",
    )
    trigger: str | None = Field(
        None,
        description="alert only when the filtered text contains this (any case; re:REGEX: "
        "matches it)",
    )
    browser: bool = Field(False, description="render the page in a browser first")
    paused: bool = Field(False, description="start paused: no checks, no digests until resumed")
    tags: Tags | None = None
    every: int | None = Field(None, description=EVERY_DESCRIPTION)
    cron: str | None = Field(None, max_length=CRON_LENGTH, description=CRON_DESCRIPTION)

    hints = {
        "url": "give the address of the page",
        "include": "a list of texts",
        "exclude": "a list of texts",
        "ignore": "a list of texts",
        "tags": TAG_HINT,
        **SCHEDULE_HINTS,
    }
    unknown_field = "not a field of a tracking"


def new_tracking_body(settings: WebSettings) -> type[Body]:
    """The body of ``POST /api/pages`` under ``settings``' longest URL."""
    return _new_tracking_body(settings.web_url_max)


@functools.lru_cache(maxsize=16)
def _new_tracking_body(url_most: int) -> type[Body]:
    return create_model("NewTracking", __base__=_TrackingFields, url=(str, _text(url_most)))


class TrackingChange(Body):
    """``PATCH /api/pages/{page_id}``: the fields given change, the others do not."""

    paused: bool = unchanged(description="pause (true) or resume (false)")
    tags: Tags = unchanged()
    every: int | None = Field(None, description=EVERY_DESCRIPTION)
    cron: str | None = Field(None, max_length=CRON_LENGTH, description=CRON_DESCRIPTION)
    name: str | None = Field(
        None, max_length=NAME_LENGTH, description="your name for the tracking (null: the title)"
    )

    hints = {"paused": "true or false", "tags": TAG_HINT, **SCHEDULE_HINTS}
    unknown_field = "cannot be changed here"


class NewChannel(Body):
    url: str = _text(2048, description="an Apprise URL (mailto://, ntfy://, slack://, ...)")
    hints = {"url": "an Apprise URL such as ntfy://my-topic or json://host/hook"}


class TrackingsImport(Body):
    text: str = _text(1_000_000, description="a urlwatch urls.yaml or a JODL export")
    format: Literal[FORMATS] | None = Field(  # type: ignore[valid-type]
        None, description="told from the text when not given"
    )
    hints = {"text": "the file's content (a urlwatch urls.yaml or a JODL export)"}


# -- operators ----------------------------------------------------------------------------------

_QUOTA = Field(None, ge=0, le=INT32_MAX, description="0: no limit; null: back to the default")


class QuotaChange(Body):
    email: str = _text(320)
    trackings: int | None = _QUOTA
    urls_per_day: int | None = _QUOTA
    batch: int | None = _QUOTA
    hints = {"email": "the user's e-mail address"}


class NewNode(Body):
    address: Address
    slots: int = Field(1, ge=1)


class NodeAddress(Body):
    address: Address


class NodeReload(Body):
    address: Address | None = Field(None, description="one node; null or left out: every node")


class FamilyChange(Body):
    """``PATCH /api/admin/families/{name}``: all given settings at once, or none."""

    timeout: float | None = unchanged(gt=0)
    max_attempts: int | None = unchanged(ge=1)
    idempotent: bool | None = unchanged(description="null: as the family's class says")
    strategy: str = unchanged(min_length=1, max_length=100)
    strategy_params: dict[str, Any] = unchanged()
    schedule: str | None = unchanged(description="cron: [SEC] MIN HOUR DAY MONTH WEEKDAY, or off")
    every_n_cycles: int = unchanged(ge=1)
    min_interval: float | None = unchanged(ge=0)
    priority: int = unchanged(ge=-(2**31), le=INT32_MAX)


class FamilyNodes(Body):
    nodes: list[Address] = Field(min_length=1)
    allowed: bool = True
    max_slots: int | None = Field(None, ge=1)
    labels: dict[str, str] = Field(default_factory=dict)


class NoFields(Body):
    """The body of an action that takes no input: none, or an empty object."""


# -- query parameters ---------------------------------------------------------------------------


class ResultsQuery(Query):
    after: int = unchanged(description="a cursor: the `next` of the last answer (default 0)")
    limit: int = unchanged(description="results at most (default 100)")


class RunJobsQuery(Query):
    state: Literal[LISTED_STATES] = unchanged()  # type: ignore[valid-type]
    key: str = unchanged(max_length=200, description="text in the job's key")
    after: int = unchanged(description="a cursor: the `next` of the last page")
    limit: int = unchanged()


class FamilyJobsQuery(Query):
    state: Literal[JOB_STATES] = unchanged()  # type: ignore[valid-type]
    limit: int = unchanged(ge=1, le=MAX_JOBS_LISTED, description="jobs at most (default 50)")


class ExportQuery(Query):
    format: Literal[FORMATS] = unchanged(description="default: json")  # type: ignore[valid-type]


def query_parameters(model: type[Query]) -> list[dict[str, Any]]:
    """``model``'s fields as an operation's query parameters."""
    schema = json_schema(model)
    required = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": field}
        for name, field in schema["properties"].items()
    ]


def models(settings: WebSettings) -> list[type[Body]]:
    """Every request body of the API under ``settings``."""
    return [
        urls_body(settings),
        Signup,
        Credentials,
        TokenRequest,
        Jobs,
        QueuedJobs,
        new_tracking_body(settings),
        TrackingChange,
        NewChannel,
        TrackingsImport,
        QuotaChange,
        NewNode,
        NodeAddress,
        NodeReload,
        FamilyChange,
        FamilyNodes,
        NoFields,
    ]


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema as the document shows it (its nested models by $ref)."""
    return model.model_json_schema(ref_template=REF_TEMPLATE)


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The schema of a request body as an operation shows it; the models it nests are
    $refs to the document's components (:func:`components`)."""
    schema = json_schema(model)
    schema.pop("$defs", None)
    return schema


def components(bodies: Iterable[type[BaseModel]]) -> dict[str, dict[str, Any]]:
    """The schemas of the models ``bodies`` nest (a job in a list of jobs), by name."""
    out: dict[str, dict[str, Any]] = {}
    for model in bodies:
        out.update(json_schema(model).get("$defs", {}))
    return out


__all__ = [
    "Body",
    "Query",
    "body_schema",
    "components",
    "json_schema",
    "models",
    "new_tracking_body",
    "query_parameters",
    "urls_body",
]
