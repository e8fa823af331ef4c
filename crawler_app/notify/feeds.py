"""Atom feeds of a user's detected changes, read at a secret-token URL.

A feed reader cannot log in, so the feed's URL carries a secret instead: the user's
``feed_token`` (made on first use, replaced by :func:`rotate_token`, which ends the
old URL). :func:`user_by_token` compares it in constant time. The feed lists the
confirmed changes (``change`` snapshots) of the views the user tracks, newest
first; :func:`changes` is the one query, and a feed per tag narrows it to the
trackings with that tag (same token). The XML is built with lxml's ElementTree,
which escapes every text and attribute (page titles and URLs come from the pages
users track).
"""

from __future__ import annotations

import datetime as dt
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from lxml import etree
from sqlalchemy.orm import Session

from ..fetching.filters import describe_key
from ..models import User
from . import queries

#: Entries in one feed (readers poll it; older changes are on the pages' history).
MAX_ENTRIES = 100
#: Random bytes of a feed token (URL-safe base64: 43 characters).
TOKEN_BYTES = 32

ATOM_NS = "http://www.w3.org/2005/Atom"


@dataclass(frozen=True)
class FeedEntry:
    """One detected change: a view of a page that changed at ``changed_at``."""

    snapshot_id: int
    previous_id: int | None
    page_id: int
    url: str
    title: str | None
    selector: str | None
    changed_at: dt.datetime


def feed_token(s: Session, user: User) -> str:
    """The user's feed token, made now if the user has none."""
    if not user.feed_token:
        user.feed_token = secrets.token_urlsafe(TOKEN_BYTES)
    return user.feed_token


def rotate_token(s: Session, user: User) -> str:
    """A new feed token for the user; the old feed URL stops working."""
    user.feed_token = secrets.token_urlsafe(TOKEN_BYTES)
    return user.feed_token


def user_by_token(s: Session, user_id: int, token: str) -> User | None:
    """The user whose feed ``token`` opens, or None (compared in constant time)."""
    user = s.get(User, user_id)
    stored = (user.feed_token if user is not None else None) or ""
    # Compared even when there is no user or token, so the time says nothing either way.
    same = hmac.compare_digest(stored.encode(), token.encode("utf-8", "replace"))
    return user if user is not None and stored and same else None


def tagged(s: Session, user_id: int, tag: str) -> list[int]:
    """Ids of the user's trackings with the tag ``tag`` (tags are a JSON list: read here
    rather than matched in SQL, the same way on SQLite and PostgreSQL)."""
    rows = queries.tracking_tags(s, user_id)
    return [tracking_id for tracking_id, tags in rows if tag in (tags or [])]


def changes(
    s: Session, user_id: int, limit: int = MAX_ENTRIES, tag: str | None = None
) -> list[FeedEntry]:
    """The confirmed changes of the views ``user_id`` tracks since they track them
    (only through trackings tagged ``tag``, when given), newest first."""
    only = tagged(s, user_id, tag) if tag is not None else None
    rows = queries.feed_changes(s, user_id, limit, only)
    return [
        FeedEntry(sid, prev, page_id, url, title, selector or None, taken)
        for sid, prev, page_id, url, title, selector, taken in rows
    ]


def _stamp(value: dt.datetime) -> str:
    """RFC 3339 in UTC (stored times are naive UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(timespec="seconds") + "Z"


def atom(
    entries: list[FeedEntry],
    *,
    feed_id: str,
    title: str,
    self_url: str,
    home_url: str,
    diff_url: Callable[[FeedEntry], str],
    updated: dt.datetime,
) -> bytes:
    """The Atom document (RFC 4287) of ``entries``; ``diff_url`` links each entry to
    its diff in the web UI."""
    feed = etree.Element(f"{{{ATOM_NS}}}feed", nsmap={None: ATOM_NS})

    def sub(parent: etree._Element, tag: str, text: str | None = None, **attrs: str) -> None:
        child = etree.SubElement(parent, f"{{{ATOM_NS}}}{tag}", attrs)
        if text is not None:
            child.text = text

    sub(feed, "id", feed_id)
    sub(feed, "title", title)
    newest = max((e.changed_at for e in entries), default=updated)
    sub(feed, "updated", _stamp(newest))
    sub(feed, "link", rel="self", href=self_url, type="application/atom+xml")
    sub(feed, "link", rel="alternate", href=home_url, type="text/html")
    author = etree.SubElement(feed, f"{{{ATOM_NS}}}author")
    sub(author, "name", "JODL page checker")
    for entry in entries:
        item = etree.SubElement(feed, f"{{{ATOM_NS}}}entry")
        sub(item, "id", f"{feed_id}:change:{entry.snapshot_id}")
        name = entry.title or entry.url
        if entry.selector:
            name = f"{name} ({describe_key(entry.selector)})"
        sub(item, "title", f"Changed: {name}")
        sub(item, "updated", _stamp(entry.changed_at))
        sub(item, "link", rel="alternate", href=diff_url(entry), type="text/html")
        sub(item, "link", rel="related", href=entry.url)
        sub(item, "summary", f"{entry.url} changed at {_stamp(entry.changed_at)}")
    return bytes(etree.tostring(feed, xml_declaration=True, encoding="utf-8"))
