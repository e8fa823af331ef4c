"""Diffs of two page texts as rows for templates: inline (unified) and side by side.

Rows carry plain text only; the templates escape it (autoescape), so a page's
text can never become markup, whatever it contains.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from crawler_app.change import diff as unified_diff

#: Lines of context kept around each change in the side-by-side view.
CONTEXT = 3
#: Rows shown at most in the side-by-side view.
MAX_ROWS = 2000


@dataclass(frozen=True)
class Line:
    """One line of the inline diff: ``kind`` is add, remove, hunk, header, note or same."""

    kind: str
    text: str


@dataclass(frozen=True)
class Row:
    """One row of the side-by-side diff: ``kind`` is same, change, remove, add or skip."""

    kind: str
    left_no: int | None
    left: str
    right_no: int | None
    right: str


def inline(old: str, new: str) -> list[Line]:
    """The unified diff of ``old`` and ``new`` as classified lines (empty when equal)."""
    out: list[Line] = []
    for text in unified_diff(old, new).splitlines():
        if text.startswith(("---", "+++")):
            kind = "header"
        elif text.startswith("@@"):
            kind = "hunk"
        elif text.startswith("+"):
            kind = "add"
        elif text.startswith("-"):
            kind = "remove"
        elif text.startswith("…"):
            kind = "note"
        else:
            kind = "same"
        out.append(Line(kind, text))
    return out


def side_by_side(old: str, new: str, context: int = CONTEXT, max_rows: int = MAX_ROWS) -> list[Row]:
    """Old and new lines next to each other, unchanged stretches cut to ``context`` lines."""
    a, b = old.splitlines(), new.splitlines()
    rows: list[Row] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        if rows:
            rows.append(Row("skip", None, "…", None, "…"))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows += [
                    Row("same", i + 1, a[i], j + 1, b[j])
                    for i, j in zip(range(i1, i2), range(j1, j2), strict=True)
                ]
                continue
            left = list(range(i1, i2))
            right = list(range(j1, j2))
            for k in range(max(len(left), len(right))):
                li = left[k] if k < len(left) else None
                rj = right[k] if k < len(right) else None
                kind = (
                    "change"
                    if li is not None and rj is not None
                    else ("remove" if rj is None else "add")
                )
                rows.append(
                    Row(
                        kind,
                        li + 1 if li is not None else None,
                        a[li] if li is not None else "",
                        rj + 1 if rj is not None else None,
                        b[rj] if rj is not None else "",
                    )
                )
        if len(rows) > max_rows:
            rows = rows[:max_rows]
            rows.append(Row("skip", None, "… more changes not shown", None, ""))
            break
    return rows
