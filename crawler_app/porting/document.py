"""Our own import/export format: one JSON document that keeps every field of a tracking.

::

    {"format": "jodl-trackings", "version": 1, "trackings": [
      {"url": "https://shop.example/item", "period": 1, "views": [
        {"selector": {"kind": "css", "expression": ".price"},
         "include": [], "exclude": [], "ignore": ["re:\\d+ left"], "trigger": "in stock",
         "tags": ["prices"], "paused": false, "browser": false,
         "name": "Shop price", "every": 900, "cron": null}]}]}

One entry per page (its URL and check period), one view per tracking of it
(filters, trigger, tags, pause, browser, name, schedule: ``every`` seconds or a
``cron`` expression, both null for the operator's default). When a tracking started and the page's
history are not in it: an import starts tracking anew. Every key is checked, an
unknown one too (a newer file read by an older JODL would lose it silently).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..checking.due import ScheduleError, check_schedule
from ..fetching.filters import FilterError, ViewSpec
from ..fetching.text import CSS, JSONPATH, XPATH, selector_kind
from ..models import NAME_LENGTH
from ..settings import AppSettings
from ..users.pages import PageError, check_tags, normalise_url
from .spec import Exported, Parsed, Problem, TrackingSpec

FORMAT = "jodl-trackings"
VERSION = 1
#: A view's keys, each with the check of its value.
VIEW_KEYS = (
    "selector", "include", "exclude", "ignore", "trigger", "tags", "paused", "browser",
    "name", "every", "cron",
)  # fmt: skip
PAGE_KEYS = ("url", "period", "views")


def looks_like(text: str) -> bool:
    """Whether ``text`` is (meant to be) this format rather than a ``urls.yaml``."""
    return text.lstrip().startswith("{")


def _selector(value: Any) -> str | None:
    """The view's selector as :meth:`ViewSpec.build` takes it; FilterError if malformed."""
    if value is None:
        return None
    if (
        isinstance(value, dict)
        and set(value) == {"kind", "expression"}
        and value["kind"] in (CSS, XPATH, JSONPATH)
        and isinstance(value["expression"], str)
    ):
        return f"{value['kind']}:{value['expression']}"
    raise FilterError('selector: null or {"kind": "css|xpath|jsonpath", "expression": "..."}')


def _flag(view: dict[str, Any], name: str) -> bool:
    value = view.get(name, False)
    if not isinstance(value, bool):
        raise FilterError(f"{name}: true or false")
    return value


def _name(view: dict[str, Any]) -> str | None:
    value = view.get("name")
    if value is not None and (not isinstance(value, str) or len(value) > NAME_LENGTH):
        raise FilterError(f"name: null or text of at most {NAME_LENGTH} characters")
    return value or None


def _schedule(view: dict[str, Any], settings: AppSettings) -> Any:
    every, cron = view.get("every"), view.get("cron")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int)):
        raise FilterError("every: null or whole seconds")
    if cron is not None and not isinstance(cron, str):
        raise FilterError("cron: null or five cron fields")
    return check_schedule(every, cron, settings)


def _view(
    page: dict[str, Any], url: str, view: Any, where: str, settings: AppSettings
) -> TrackingSpec | Problem:
    if not isinstance(view, dict):
        return Problem("a view is an object", where=where)
    unknown = sorted(set(view) - set(VIEW_KEYS))
    if unknown:
        return Problem(f"{unknown[0]}: no such field of a view", where=where)
    try:
        spec = ViewSpec.build(
            selector=_selector(view.get("selector")),
            include=view.get("include"),
            exclude=view.get("exclude"),
            ignore=view.get("ignore"),
            trigger=view.get("trigger"),
        )
        tags = view.get("tags", [])
        if not isinstance(tags, list):
            raise FilterError("tags: a list of words")
        labels = tuple(check_tags(tags))
        paused, browser = _flag(view, "paused"), _flag(view, "browser")
        name, schedule = _name(view), _schedule(view, settings)
    except (FilterError, PageError, ScheduleError) as exc:
        return Problem(str(exc), where=where)
    return TrackingSpec(
        url=url,
        view=spec,
        tags=labels,
        paused=paused,
        browser=browser,
        period=page.get("period", 1),
        schedule=schedule,
        name=name,
        where=where,
    )


def _page(page: Any, where: str, parsed: Parsed, settings: AppSettings) -> None:
    if not isinstance(page, dict):
        parsed.problems.append(Problem("an entry is an object with url and views", where=where))
        return
    unknown = sorted(set(page) - set(PAGE_KEYS))
    if unknown:
        parsed.problems.append(Problem(f"{unknown[0]}: no such field", where=where))
        return
    period = page.get("period", 1)
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        parsed.problems.append(Problem("period: a whole number of cycles, at least 1", where=where))
        return
    views = page.get("views")
    if not isinstance(page.get("url"), str) or not isinstance(views, list) or not views:
        parsed.problems.append(Problem("url (text) and views (a list of one or more)", where=where))
        return
    try:
        url = normalise_url(page["url"])
    except PageError as exc:
        parsed.problems.append(Problem(str(exc), where=where))
        return
    for i, view in enumerate(views):
        spec = _view(page, url, view, f"{where}.views[{i}]", settings)
        if isinstance(spec, Problem):
            parsed.problems.append(spec)
        else:
            parsed.specs.append(spec)


def parse(text: str, settings: AppSettings | None = None) -> Parsed:
    """The trackings a document of this format asks for, with the problem of every
    entry that cannot be read (:meth:`Parsed.checked` refuses the file if there is one);
    schedules within ``settings``' bounds (default: the environment's)."""
    parsed = Parsed()
    try:
        data = json.loads(text)
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        parsed.problems.append(Problem(f"not valid JSON: {exc}", line=line))
        return parsed
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        parsed.problems.append(Problem(f'not a JODL export: "format" is not "{FORMAT}"'))
        return parsed
    version = data.get("version")
    if version != VERSION:
        parsed.problems.append(
            Problem(f"version {version!r}: this JODL reads version {VERSION} (a newer JODL?)")
        )
        return parsed
    unknown = sorted(set(data) - {"format", "version", "trackings"})
    trackings = data.get("trackings")
    if unknown or not isinstance(trackings, list):
        parsed.problems.append(Problem("the document has format, version and trackings only"))
        return parsed
    settings = settings or AppSettings.from_env()
    for i, page in enumerate(trackings):
        _page(page, f"trackings[{i}]", parsed, settings)
    return parsed


def _view_json(item: Exported) -> dict[str, Any]:
    view = item.view
    selector = None
    if view.selector:
        kind, expression = selector_kind(view.selector)
        selector = {"kind": kind, "expression": expression}
    return {
        "selector": selector,
        "include": list(view.include),
        "exclude": list(view.exclude),
        "ignore": list(view.ignore),
        "trigger": view.trigger,
        "tags": list(item.tags),
        "paused": item.paused,
        "browser": item.browser,
        "name": item.name,
        "every": item.schedule.every,
        "cron": item.schedule.cron,
    }


def write(items: Iterable[Exported]) -> str:
    """The trackings as a document of this format (pages in the order given)."""
    pages: dict[str, dict[str, Any]] = {}
    for item in items:
        page = pages.setdefault(item.url, {"url": item.url, "period": item.period, "views": []})
        page["views"].append(_view_json(item))
    document = {"format": FORMAT, "version": VERSION, "trackings": list(pages.values())}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
