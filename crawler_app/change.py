"""Confirmed change detection: when a page counts as changed, and the diff to show.

Pages are noisy: a timestamp, a rotating banner, a server that alternates
between two versions. Users of page monitors complain most about alerts for
such noise, so a change is only reported once it is *confirmed*.

The rule, for one page, given the fingerprint of the text just fetched, the
fingerprints of the page's stored snapshots (newest first; the newest is the
page's current state) and the pending candidate fingerprint (if any):

``ignored``
    The fetch failed, or its text is empty. Errors and blank pages never count
    as changes; the pending candidate is kept.
``baseline``
    There is no snapshot yet: store this one as the first; notify no one.
``unchanged``
    The text equals the current snapshot. A pending candidate is dropped: the
    page went back, so the candidate was noise.
``flip``
    The text equals one of the earlier snapshots (within ``flip_window``): the
    page flips between states it has shown before. Never a change; the pending
    candidate is dropped.
``candidate``
    A new text seen for the first time (or different from the pending
    candidate): remember it as pending, notify no one yet.
``confirmed``
    The new text equals the pending candidate: the same new text was seen on
    two fetches in a row. Store a snapshot and notify.

A page whose text is new on every fetch (a clock, a nonce) therefore never
confirms, and neither does one flipping between known states; an edit that
stays is confirmed on the second fetch that sees it.

A ``304 Not Modified`` answer means "the text you fetched last": pass the
fingerprint of the last fetched text (the pending candidate if there is one,
else the current snapshot).

:func:`diff` and :func:`short_diff` render the change for the history page and
for e-mails.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from .text import fingerprint

IGNORED = "ignored"
BASELINE = "baseline"
UNCHANGED = "unchanged"
FLIP = "flip"
CANDIDATE = "candidate"
CONFIRMED = "confirmed"

#: Earlier snapshots (after the current one) a new text is compared with to spot flips.
DEFAULT_FLIP_WINDOW = 5
#: Lines of context around each change in :func:`diff`.
DEFAULT_CONTEXT = 3
#: Largest diff kept, in lines and in characters.
MAX_DIFF_LINES = 2000
MAX_DIFF_CHARS = 200_000
#: Size of the short diff put in e-mails.
SHORT_DIFF_LINES = 12
SHORT_DIFF_LINE_CHARS = 200

#: Fingerprint of the empty text: an empty page is never a change.
EMPTY_FINGERPRINT = fingerprint("")


@dataclass(frozen=True)
class Decision:
    """The verdict on one fetch and what to store.

    ``verdict`` is one of the module's verdict names; ``pending`` is the pending
    candidate fingerprint to keep after this fetch (None: none);
    ``store_snapshot`` says whether the fetched text becomes a new snapshot;
    ``notify`` whether the users tracking the page are told.
    """

    verdict: str
    pending: str | None
    store_snapshot: bool = False
    notify: bool = False


def decide(
    new: str | None,
    history: Sequence[str],
    pending: str | None = None,
    *,
    flip_window: int = DEFAULT_FLIP_WINDOW,
) -> Decision:
    """Apply the confirmation rule (module doc) to one fetch.

    ``new`` is the fingerprint of the fetched text, or None if the fetch failed;
    ``history`` the stored snapshot fingerprints, newest first; ``pending`` the
    candidate remembered from the previous fetch.
    """
    if new is None or new == EMPTY_FINGERPRINT:
        return Decision(IGNORED, pending)
    if not history:
        return Decision(BASELINE, None, store_snapshot=True)
    if new == history[0]:
        return Decision(UNCHANGED, None)
    if new in history[1 : 1 + flip_window]:
        return Decision(FLIP, None)
    if new == pending:
        return Decision(CONFIRMED, None, store_snapshot=True, notify=True)
    return Decision(CANDIDATE, new)


def _limit(lines: list[str], max_lines: int, max_chars: int) -> list[str]:
    kept: list[str] = []
    size = 0
    for i, line in enumerate(lines):
        size += len(line) + 1
        if i >= max_lines or size > max_chars:
            kept.append(f"… {len(lines) - i} more diff lines not shown")
            break
        kept.append(line)
    return kept


def diff(
    old_text: str,
    new_text: str,
    *,
    context: int = DEFAULT_CONTEXT,
    max_lines: int = MAX_DIFF_LINES,
    max_chars: int = MAX_DIFF_CHARS,
    old_label: str = "before",
    new_label: str = "after",
) -> str:
    """Unified diff of two normalised texts (line by line), cut to the size limits.

    Returns the empty string when the texts are equal.
    """
    lines = list(
        difflib.unified_diff(
            old_text.splitlines(),
            new_text.splitlines(),
            fromfile=old_label,
            tofile=new_label,
            n=context,
            lineterm="",
        )
    )
    return "\n".join(_limit(lines, max_lines, max_chars))


def short_diff(
    old_text: str,
    new_text: str,
    *,
    max_lines: int = SHORT_DIFF_LINES,
    line_chars: int = SHORT_DIFF_LINE_CHARS,
) -> str:
    """The removed (``- ``) and added (``+ ``) lines only, few and shortened, for e-mails."""
    changed: list[str] = []
    for line in difflib.unified_diff(old_text.splitlines(), new_text.splitlines(), n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        body = line[1:].rstrip("\n")
        if len(body) > line_chars:
            body = body[: line_chars - 1] + "…"
        changed.append(f"{line[0]} {body}")
    return "\n".join(_limit(changed, max_lines, max_lines * (line_chars + 3)))
