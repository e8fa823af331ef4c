"""Times in the pages: a ``<time>`` element a browser shows in its own time zone.

The server knows only UTC; the reader's zone is the browser's. So a template
writes ``{{ value|when }}``: a ``<time datetime="…Z">`` whose text is the UTC
time in words (what a page without scripts shows), and ``app.js`` rewrites it
as the reader's local time with how long ago (or how soon) it is, e.g.
"22 Nov, 15:30 (3 min ago)".
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from markupsafe import Markup, escape


def parse(value: Any) -> dt.datetime | None:
    """An aware UTC datetime from a datetime (naive: UTC) or an ISO text; None otherwise."""
    if isinstance(value, str) and value:
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def when(value: Any, empty: str = "") -> Markup:
    """``<time>`` for ``value`` (``empty`` when there is no time), for the ``when`` filter."""
    moment = parse(value)
    if moment is None:
        return Markup(escape(value if isinstance(value, str) and value else empty))
    iso = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    text = moment.strftime("%d %b %Y, %H:%M UTC")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(iso, iso, text)


def iso(value: Any) -> str | None:
    """ISO text in UTC with a Z (JSON answers); None when there is no time."""
    moment = parse(value)
    if moment is None:
        return None
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
