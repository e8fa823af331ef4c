"""Digest e-mails: rendered from the package's templates, never from user-editable ones.

Users supply URLs, page text and selectors; none of it can reach a template's
source, only its variables. The HTML template is autoescaped; undefined
variables are errors, so a template bug fails loudly in the tests rather than
sending an e-mail with holes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

#: Most changed pages listed in one digest (the rest are counted).
MAX_ITEMS = 50

_ENV = Environment(
    loader=PackageLoader("crawler_app", "templates"),
    autoescape=select_autoescape(enabled_extensions=("html",), default_for_string=True),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


@dataclass
class ChangedPage:
    """One line of a digest: a tracked page (or the part a selector picks) that changed."""

    url: str
    title: str | None
    selector: str | None
    changed_at: dt.datetime
    diff: str
    page_id: int = 0


@dataclass
class Digest:
    """Everything a digest e-mail says to one user."""

    to: str
    items: list[ChangedPage] = field(default_factory=list)
    app_url: str | None = None

    @property
    def subject(self) -> str:
        # No page text in the subject: it is a header, and users choose the pages.
        count = len(self.items)
        return f"JODL: {count} tracked page{'s' if count != 1 else ''} changed"


def render(digest: Digest) -> tuple[str, str, str]:
    """(subject, plain text, HTML) of a digest."""
    shown = digest.items[:MAX_ITEMS]
    context: dict[str, Any] = {
        "digest": digest,
        "items": shown,
        "more": len(digest.items) - len(shown),
        "app_url": (digest.app_url or "").rstrip("/") or None,
    }
    text = _ENV.get_template("digest.txt").render(context)
    html = _ENV.get_template("digest.html").render(context)
    return digest.subject, text, html


def diff_lines(diff: str) -> list[tuple[str, str]]:
    """Short-diff lines as (kind, text): kind ``add``, ``del`` or ``note``."""
    out = []
    for line in diff.splitlines():
        if line.startswith("+ "):
            out.append(("add", line[2:]))
        elif line.startswith("- "):
            out.append(("del", line[2:]))
        else:
            out.append(("note", line))
    return out


_ENV.filters["diff_lines"] = diff_lines
