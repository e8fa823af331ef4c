"""Import and export of a user's trackings: urlwatch's ``urls.yaml`` and our own JSON
format (docs/import-export.md).

:func:`parse` reads a file (the format told from its content when not given) into
tracking specs, each entry that cannot be mapped a :class:`Problem`;
:func:`import_trackings` writes them all or nothing; :func:`export` writes a
user's trackings out. The CLI (``jodl import``/``jodl export``), the web UI and
the API call these.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ..users.pages import get_user
from . import document, urlwatch
from .spec import MAX_IMPORT_BYTES, ImportRefused, Parsed, Problem, TrackingSpec
from .store import ImportReport, exported, import_trackings

#: The formats, as ``--format`` and ``?format=`` name them.
FORMATS = ("urlwatch", "json")


def detect(text: str) -> str:
    """The format of ``text``: ``json`` when it is a JSON object, else ``urlwatch``."""
    return "json" if document.looks_like(text) else "urlwatch"


def parse(text: str, format: str | None = None) -> Parsed:
    """The trackings ``text`` asks for (see :class:`Parsed`); ``format`` one of
    :data:`FORMATS`, or None to tell it from the content."""
    if len(text.encode("utf-8", "replace")) > MAX_IMPORT_BYTES:
        return Parsed(problems=[Problem(f"the file is larger than {MAX_IMPORT_BYTES} bytes")])
    chosen = format or detect(text)
    if chosen not in FORMATS:
        return Parsed(problems=[Problem(f"format {chosen!r}: one of {', '.join(FORMATS)}")])
    return document.parse(text) if chosen == "json" else urlwatch.parse(text)


def export(s: Session, email: str, format: str) -> str:
    """The user's trackings as a file of ``format`` (one of :data:`FORMATS`)."""
    if format not in FORMATS:
        raise ValueError(f"format {format!r}: one of {', '.join(FORMATS)}")
    user = get_user(s, email)
    items = exported(s, user.email)
    return document.write(items) if format == "json" else urlwatch.write(items, user.email)


__all__ = [
    "FORMATS",
    "MAX_IMPORT_BYTES",
    "ImportRefused",
    "ImportReport",
    "Parsed",
    "Problem",
    "TrackingSpec",
    "detect",
    "export",
    "import_trackings",
    "parse",
]
