"""Pages that are not content: error pages served with status 200, and script-built pages.

A site under maintenance often answers ``200 OK`` with a short page saying so;
a CDN or a framework may do the same for its errors. Taking that page as the
new content alerts every tracker twice (the page "changed", then "changed
back"). :func:`error_page` tells such a page by two signs together: it is short
and says it is an error, and it has lost most of the view's baseline (so a page
whose content is *about* maintenance, always, is still content).

A page whose visible text is empty or tiny while it carries scripts builds its
text in the browser (:func:`built_by_script`); its tracker is told so.
"""

from __future__ import annotations

import re

from ..checking.variance import Model, text_keys

#: Phrases of error and maintenance pages (English; the usual wording of servers,
#: CDNs and status pages).
ERROR_PHRASES = re.compile(
    r"\b(?:under maintenance|scheduled maintenance|down for maintenance|maintenance mode"
    r"|temporarily unavailable|service unavailable|be right back|bad gateway"
    r"|gateway time-?out|internal server error|something went wrong|too many requests"
    r"|access denied|page not found|404 not found|rate limit exceeded)\b",
    re.IGNORECASE,
)
#: Longest text taken for an error page: real error pages are a few lines.
ERROR_PAGE_MAX_CHARS = 2000
#: Share of the baseline's lines an error page keeps at most (a page that keeps more
#: is the baseline with a notice added: content).
ERROR_PAGE_KEPT = 0.5
#: Visible characters below which a page with scripts counts as built by its scripts.
SCRIPT_PAGE_MAX_CHARS = 80
_SCRIPT = re.compile(rb"<script\b", re.IGNORECASE)


def error_page(title: str | None, text: str, model: Model) -> str | None:
    """Why the fetched view is an error page (or blank), or None when it is content."""
    if not text.strip():
        return "the page answered 200 with no visible text"
    if len(text) > ERROR_PAGE_MAX_CHARS:
        return None
    found = ERROR_PHRASES.search(f"{title or ''}\n{text}")
    if found is None:
        return None
    if model.has_base:
        base = model.base_masked()
        if base and len(base & model.masked(text_keys(text))) > ERROR_PAGE_KEPT * len(base):
            return None
    return f"the page answered 200 but reads as an error page ({found.group(0)!r})"


def built_by_script(body: bytes | None, text: str) -> bool:
    """True when the body carries scripts and almost no visible text."""
    return bool(body) and len(text) < SCRIPT_PAGE_MAX_CHARS and _SCRIPT.search(body) is not None
