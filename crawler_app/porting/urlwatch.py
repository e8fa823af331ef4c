"""urlwatch's ``urls.yaml``: read into tracking specs, and written from trackings.

A ``urls.yaml`` is a stream of YAML documents, one job each. A job maps to a
tracking when it fetches an http(s) URL and its filters are ones a view has
(docs/import-export.md lists them): ``css``, ``xpath``, ``jsonpath`` pick the
part (one, before any line filter, as a view applies them); ``grep`` keeps the
lines matching (one: urlwatch chains several, which keeps the lines matching
all of them); ``grep-invert`` (or ``exclude``) drops the lines matching;
``html2text`` and ``strip`` are what every check does anyway. Anything else (a
``command`` job, ``shellpipe``, ``re.sub``, POST data, headers) is a problem
with the line it starts on, and the file is refused whole. Settings that only
tune urlwatch's own fetching (``max_tries``, ``ignore_cached``, ...) are read
and dropped, with a note.

Written back, each tracking is one job; what urlwatch cannot say (tags, pauses,
triggers, periods) is named in a comment at the top of the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, SequenceNode

from ..fetching.filters import REGEX_PREFIX, FilterError, ViewSpec
from ..fetching.text import CSS, XPATH, selector_kind
from ..models import NAME_LENGTH
from ..users.pages import PageError, normalise_url
from .spec import Exported, Parsed, Problem, TrackingSpec

#: Job keys read and dropped: they tune how urlwatch fetches or shows, not what is compared.
DROPPED_KEYS = frozenset(
    {
        "max_tries",
        "ignore_cached",
        "ignore_connection_errors",
        "ignore_http_error_codes",
        "ignore_timeout_errors",
        "ignore_too_many_redirects",
        "ignore_dh_key_too_small",
        "timeout",
        "encoding",
        "treat_new_as_changed",
        "compared_versions",
        "monospace",
        "diff_tool",
        "user_visible_url",
        "wait_until",
        "wait_for",
    }
)
#: Filters that change nothing here: every check's text is already plain, stripped lines.
NO_OP_FILTERS = frozenset({"html2text", "strip"})
#: Filters that pick the part of the page, with the name of their argument in the dict form.
SELECTOR_FILTERS = {"css": "selector", "xpath": "path", "jsonpath": "path"}
#: Line filters: urlwatch's name -> (view field, case-insensitive).
LINE_FILTERS = {
    "grep": ("include", False),
    "grepi": ("include", True),
    "grep-invert": ("exclude", False),
    "grepi-invert": ("exclude", True),
    "exclude": ("exclude", False),
}
#: Jobs of urlwatch that are not web pages.
_COMMAND_KEYS = ("command",)


@dataclass
class _Job:
    """One job's fields as read, each with the line it starts on (1-based)."""

    line: int
    fields: dict[str, tuple[Any, int, Node]]


def _jobs(text: str, parsed: Parsed) -> list[_Job]:
    constructor = SafeConstructor()
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(exc, "problem", None) or "not YAML"
        parsed.problems.append(Problem(f"not valid YAML: {reason}", line=line))
        return []
    jobs = []
    for node in documents:
        if node is None:
            continue
        line = node.start_mark.line + 1
        if not isinstance(node, MappingNode):
            parsed.problems.append(Problem("a job is a mapping (url: ..., filter: ...)", line))
            continue
        fields: dict[str, tuple[Any, int, Node]] = {}
        try:
            for key_node, value_node in node.value:
                key = constructor.construct_object(key_node, deep=True)
                value = constructor.construct_object(value_node, deep=True)
                fields[str(key)] = (value, key_node.start_mark.line + 1, value_node)
        except ConstructorError as exc:
            parsed.problems.append(Problem(f"cannot be read: {exc.problem}", line))
            continue
        jobs.append(_Job(line, fields))
    return jobs


def _filter_items(value: Any, node: Node, line: int) -> list[tuple[str, Any, int]] | Problem:
    """The job's filters as ``(name, argument, line)``, from the string form
    (``css:.price,html2text``) or the list form (``- css: .price``)."""
    if isinstance(value, str):
        items = []
        for part in value.split(","):
            name, _, argument = part.strip().partition(":")
            items.append((name.strip(), argument.strip() or None, line))
        return items
    if not isinstance(value, list) or not isinstance(node, SequenceNode):
        return Problem("filter: a text such as css:.price,html2text or a list", line)
    items = []
    for item, item_node in zip(value, node.value, strict=True):
        at = item_node.start_mark.line + 1
        if isinstance(item, str):
            items.append((item, None, at))
        elif isinstance(item, dict) and len(item) == 1:
            ((name, argument),) = item.items()
            items.append((str(name), argument, at))
        else:
            return Problem("a filter is a name, or one name with its argument", at)
    return items


def _argument(name: str, argument: Any, subkey: str) -> str | None:
    """A filter's argument: the text itself, or ``{subkey: text}``; None if neither."""
    if isinstance(argument, dict) and set(argument) <= {subkey, "method"}:
        if argument.get("method", "html") not in ("html", "xml"):
            return None
        argument = argument.get(subkey)
    if isinstance(argument, str | int | float) and not isinstance(argument, bool):
        return str(argument)
    return None


def _view(items: list[tuple[str, Any, int]]) -> ViewSpec | Problem:
    selector: str | None = None
    lines: dict[str, list[str]] = {"include": [], "exclude": []}
    for name, argument, at in items:
        if name in NO_OP_FILTERS:
            continue
        if name in SELECTOR_FILTERS:
            expression = _argument(name, argument, SELECTOR_FILTERS[name])
            if expression is None:
                return Problem(f"{name}: give the expression only", at)
            if selector is not None:
                return Problem(f"{name}: a view picks one part of the page; this is a second", at)
            if lines["include"] or lines["exclude"]:
                return Problem(f"{name} after a line filter: a view picks the part first", at)
            selector = f"{name}:{expression}"
        elif name in LINE_FILTERS:
            field, caseless = LINE_FILTERS[name]
            pattern = _argument(name, argument, "re")
            if pattern is None:
                return Problem(f"{name}: give the regular expression only", at)
            if field == "include" and lines["include"]:
                # urlwatch chains them (lines matching all); a view keeps lines matching any.
                return Problem(f"{name}: a second grep keeps lines matching both; write one", at)
            lines[field].append(f"(?i){pattern}" if caseless else pattern)
        else:
            return Problem(f"the filter {name!r} has no equivalent here", at)
    try:
        return ViewSpec.build(selector=selector, include=lines["include"], exclude=lines["exclude"])
    except FilterError as exc:
        return Problem(str(exc), items[0][2] if items else None)


def _spec(job: _Job, parsed: Parsed) -> TrackingSpec | Problem:
    fields = job.fields
    for key in _COMMAND_KEYS:
        if key in fields:
            return Problem(f"{key} jobs run programs; only web pages can be tracked", job.line)
    url_field = fields.get("url") or fields.get("navigate")
    if url_field is None or not isinstance(url_field[0], str):
        return Problem("no url", job.line)
    browser: bool | None = True if "navigate" in fields and "url" not in fields else None
    name: str | None = None
    for key, (value, at, _) in fields.items():
        if key in ("url", "navigate", "filter"):
            continue
        if key == "name":
            if not isinstance(value, str) or len(value) > NAME_LENGTH:
                return Problem(f"name: text of at most {NAME_LENGTH} characters", at)
            name = value or None
        elif key == "use_browser" and isinstance(value, bool):
            browser = value
        elif key == "kind" and value in ("url", "browser"):
            browser = True if value == "browser" else browser
        elif key in DROPPED_KEYS:
            parsed.notes.append(f"line {at}: {key} is urlwatch's own setting, not kept")
        else:
            return Problem(f"{key}: no equivalent here", at)
    url, url_line, _ = url_field
    try:
        normal = normalise_url(url)
    except PageError as exc:
        return Problem(str(exc), url_line)
    items: list[tuple[str, Any, int]] = []
    if "filter" in fields:
        value, at, node = fields["filter"]
        found = _filter_items(value, node, at)
        if isinstance(found, Problem):
            return found
        items = found
    view = _view(items)
    if isinstance(view, Problem):
        return view
    return TrackingSpec(url=normal, view=view, browser=browser, name=name, line=job.line)


def parse(text: str) -> Parsed:
    """The trackings a ``urls.yaml`` asks for, with the problem of every job that
    cannot be mapped (:meth:`Parsed.checked` refuses the file if there is one)."""
    parsed = Parsed()
    for job in _jobs(text, parsed):
        spec = _spec(job, parsed)
        if isinstance(spec, Problem):
            parsed.problems.append(spec)
        else:
            parsed.specs.append(spec)
    return parsed


# -- writing -------------------------------------------------------------------------------------


def _group(pattern: str) -> str:
    """``pattern`` as a group of an alternation (a leading ``(?i)`` scoped to it: Python
    allows global flags only at the start)."""
    if pattern.startswith("(?i)"):
        return f"(?i:{pattern[4:]})"
    return f"(?:{pattern})"


def _job(item: Exported) -> dict[str, Any]:
    job: dict[str, Any] = {}
    if item.name or item.title:
        job["name"] = item.name or item.title
    job["url"] = item.url
    if item.browser:
        job["use_browser"] = True
    filters: list[Any] = []
    view = item.view
    if view.selector:
        kind, expression = selector_kind(view.selector)
        filters.append({kind: expression})
        if kind in (CSS, XPATH):  # urlwatch's css and xpath give HTML; ours give text
            filters.append("html2text")
    if view.include:
        # A view keeps lines matching any of its patterns: one grep of their union.
        union = view.include[0]
        if len(view.include) > 1:
            union = "|".join(_group(p) for p in view.include)
        filters.append({"grep": union})
    filters.extend({"grep-invert": pattern} for pattern in view.exclude)
    for rule in view.ignore:  # text in any case, or re:REGEX
        pattern = (
            rule[len(REGEX_PREFIX) :]
            if rule.startswith(REGEX_PREFIX)
            else ("(?i)" + re.escape(rule))
        )
        filters.append({"grep-invert": pattern})
    if filters:
        job["filter"] = filters
    return job


def _left_out(items: list[Exported]) -> list[str]:
    """What urlwatch cannot say of these trackings, in words."""

    def count(n: int, one: str, many: str) -> str:
        return f"{n} {one if n == 1 else many}"

    lost = []
    if n := sum(1 for i in items if i.tags):
        lost.append(f"the tags of {count(n, 'tracking', 'trackings')}")
    if n := sum(1 for i in items if i.paused):
        lost.append(f"{count(n, 'paused tracking', 'paused trackings')} (written as active)")
    if n := sum(1 for i in items if i.view.trigger):
        lost.append(f"the alert trigger of {count(n, 'tracking', 'trackings')}")
    if n := sum(1 for i in items if i.period != 1):
        lost.append(f"the check period of {count(n, 'page', 'pages')} (every N-th cycle)")
    if n := sum(1 for i in items if i.schedule.every is not None or i.schedule.cron):
        lost.append(f"the schedule of {count(n, 'tracking', 'trackings')} (urlwatch runs all)")
    return lost


def write(items: Iterable[Exported], email: str) -> str:
    """The trackings as a ``urls.yaml``, with a comment naming what it leaves out."""
    items = list(items)
    lost = _left_out(items)
    head = [f"# urlwatch jobs: the trackings of {email}, exported by JODL."]
    if lost:
        head.append("# urlwatch cannot express everything a tracking has; left out here:")
        head.extend(f"#   - {what}" for what in lost)
        head.append("# (jodl export --format json keeps every field.)")
    else:
        head.append("# Nothing was left out.")
    body = (
        yaml.safe_dump_all(
            [_job(i) for i in items], sort_keys=False, allow_unicode=True, explicit_start=True
        )
        if items
        else ""
    )
    return "\n".join(head) + "\n" + body
