"""A tracking's view of a page: what part of it is compared, and when it alerts.

A :class:`ViewSpec` holds a tracking's filters, applied in this order to the
text of one fetch:

1. ``selector``: a CSS selector or an XPath expression (HTML, XML), or a JSONPath
   expression (JSON), picks part of the page (:mod:`crawler_app.fetching.text`);
2. ``include``: regular expressions; when given, only lines matching one are kept;
3. ``exclude``: regular expressions; lines matching one are dropped;
4. ``ignore``: texts; lines containing one (any case) are dropped, for phrases
   (a date stamp, "Last updated") without writing a regular expression; a rule
   written ``re:...`` is a regular expression instead.

Change detection compares what is left. The ``trigger`` says when a change is
worth an alert: only when the new filtered text contains it (any case), or, written
``re:...``, matches it; a change without it becomes the new baseline unannounced.

A spec is stored, sent to the agents and matched with its snapshots as one string,
its :attr:`ViewSpec.key`: ``""`` for the whole page, the selector alone when that is
all it has (what trackings stored before filters), else canonical JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .text import SelectorError, parse_selector

#: Longest view key stored, in UTF-8 bytes (a unique index holds it: PostgreSQL's
#: B-tree entries stop at about 2,700 bytes).
VIEW_KEY_BYTES = 1000
#: Longest single rule (regular expression or text), in characters.
RULE_LENGTH = 300
#: Most rules of one kind per view.
MAX_RULES = 20
#: The prefix of a rule written as a regular expression (``ignore``, ``trigger``).
REGEX_PREFIX = "re:"


class FilterError(ValueError):
    """A filter that cannot be used; the message names it in one line."""


def _regex(pattern: str, what: str) -> re.Pattern[str]:
    if len(pattern) > RULE_LENGTH:
        raise FilterError(f"{what} {pattern[:40]!r}...: at most {RULE_LENGTH} characters")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise FilterError(f"invalid regular expression in {what} {pattern!r}: {exc}") from None


def _text_rule(rule: str, what: str) -> re.Pattern[str]:
    """A rule that is plain text (matched in any case) unless written ``re:...``."""
    if rule.startswith(REGEX_PREFIX):
        return _regex(rule[len(REGEX_PREFIX) :], what)
    if len(rule) > RULE_LENGTH:
        raise FilterError(f"{what} {rule[:40]!r}...: at most {RULE_LENGTH} characters")
    return re.compile(re.escape(rule), re.IGNORECASE)


def _rules(values: Any, what: str) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) for v in values):
        raise FilterError(f"{what}: a list of texts")
    kept = tuple(v for v in (v.strip() for v in values) if v)
    if len(kept) > MAX_RULES:
        raise FilterError(f"{what}: at most {MAX_RULES} rules")
    return kept


@dataclass(frozen=True)
class ViewSpec:
    """One view's filters (see the module doc). Build it with :meth:`build` or
    :meth:`parse`, both of which check every expression."""

    selector: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    trigger: str | None = None

    @classmethod
    def build(
        cls,
        selector: str | None = None,
        include: Any = None,
        exclude: Any = None,
        ignore: Any = None,
        trigger: str | None = None,
    ) -> ViewSpec:
        """A checked spec from what a user typed; :class:`FilterError` naming the first
        bad expression. ``selector``: CSS, XPath or JSONPath (``css:``, ``xpath:``,
        ``jsonpath:`` prefixes, or told from its first character)."""
        if selector is not None and not isinstance(selector, str):
            raise FilterError("selector: a CSS selector, XPath or JSONPath expression as text")
        if trigger is not None and not isinstance(trigger, str):
            raise FilterError("trigger: a text, or re:<regular expression>")
        stored = None
        if selector is not None and selector.strip():
            try:
                stored = parse_selector(selector).text
            except SelectorError as exc:
                raise FilterError(str(exc)) from None
        spec = cls(
            selector=stored,
            include=_rules(include, "include"),
            exclude=_rules(exclude, "exclude"),
            ignore=_rules(ignore, "ignore"),
            trigger=(trigger or "").strip() or None,
        )
        spec.compiled()  # every rule checked now, not on the agent
        if len(spec.key.encode("utf-8")) > VIEW_KEY_BYTES:
            raise FilterError(f"the filters of one view may take at most {VIEW_KEY_BYTES} bytes")
        return spec

    @classmethod
    def parse(cls, key: str | None) -> ViewSpec:
        """The spec stored as ``key`` (:attr:`key`); raises :class:`FilterError`."""
        if not key:
            return cls()
        if not key.startswith("{"):  # a selector alone (CSS never starts with "{")
            return cls.build(selector=key)
        try:
            data = json.loads(key)
        except ValueError:
            raise FilterError(f"not a view: {key[:60]!r}") from None
        if not isinstance(data, dict):
            raise FilterError(f"not a view: {key[:60]!r}")
        return cls.build(
            data.get("selector"),
            data.get("include"),
            data.get("exclude"),
            data.get("ignore"),
            data.get("trigger"),
        )

    @property
    def key(self) -> str:
        """The one string that names this view (see the module doc)."""
        if not (self.include or self.exclude or self.ignore or self.trigger):
            return self.selector or ""
        data: dict[str, Any] = {
            name: value
            for name, value in (
                ("selector", self.selector),
                ("include", list(self.include)),
                ("exclude", list(self.exclude)),
                ("ignore", list(self.ignore)),
                ("trigger", self.trigger),
            )
            if value
        }
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def filters_lines(self) -> bool:
        """Whether lines are filtered after the selector."""
        return bool(self.include or self.exclude or self.ignore)

    def compiled(self) -> _Compiled:
        return _Compiled(
            include=tuple(_regex(r, "include") for r in self.include),
            exclude=tuple(_regex(r, "exclude") for r in self.exclude),
            ignore=tuple(_text_rule(r, "ignore") for r in self.ignore),
            trigger=_text_rule(self.trigger, "trigger") if self.trigger else None,
        )

    def filter_lines(self, text: str) -> str:
        """``text`` (normalised, one line per block) with the line filters applied."""
        if not self.filters_lines:
            return text
        return self.compiled().filter_lines(text)

    def triggered(self, text: str | None) -> bool:
        """Whether a change to ``text`` alerts: no trigger, or ``text`` holds it."""
        if not self.trigger:
            return True
        pattern = self.compiled().trigger
        return pattern is not None and pattern.search(text or "") is not None

    def describe(self) -> str:
        """The filters in a few words for a list (empty for the whole page)."""
        parts = [self.selector] if self.selector else []
        parts += [f"include /{r}/" for r in self.include]
        parts += [f"exclude /{r}/" for r in self.exclude]
        parts += [f"ignore {r!r}" for r in self.ignore]
        if self.trigger:
            parts.append(f"alert on {self.trigger!r}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """The filters as the API shows them."""
        return {
            "selector": self.selector,
            "include": list(self.include),
            "exclude": list(self.exclude),
            "ignore": list(self.ignore),
            "trigger": self.trigger,
        }


@dataclass(frozen=True)
class _Compiled:
    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...]
    ignore: tuple[re.Pattern[str], ...]
    trigger: re.Pattern[str] | None

    def filter_lines(self, text: str) -> str:
        kept = []
        for line in text.split("\n"):
            if self.include and not any(p.search(line) for p in self.include):
                continue
            if any(p.search(line) for p in self.exclude) or any(
                p.search(line) for p in self.ignore
            ):
                continue
            kept.append(line)
        return "\n".join(kept)


def describe_key(key: str | None) -> str:
    """:meth:`ViewSpec.describe` of a stored key (the key itself if it no longer parses)."""
    try:
        return ViewSpec.parse(key).describe()
    except FilterError:
        return key or ""
