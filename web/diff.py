"""Diffs of two page texts as people read them: changed lines, and within each the
changed words, inline or side by side. No diff syntax (``---``, ``@@``, ``+``) is shown.

Lines are matched first (``difflib.SequenceMatcher`` over lines, as the change
detection compares them); a removed line and the added line that replaced it are then
compared word by word, so an edit of one price in a long line highlights the price.
Rows carry plain text only; the templates escape it (autoescape), so a page's text can
never become markup, whatever it contains.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass

#: Lines of context kept around each change.
CONTEXT = 3
#: Rows shown at most in either view.
MAX_ROWS = 2000
#: Lines longer than this are not compared word by word (the whole line is marked):
#: the word matcher is quadratic in the worst case, and such a line is rarely prose.
WORD_DIFF_MAX_CHARS = 5000
#: Below this similarity a replaced line is marked whole: highlighting the few words two
#: unrelated lines share would be noise.
WORD_DIFF_MIN_RATIO = 0.3
#: A word, a run of spaces, or one other character.
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")


@dataclass(frozen=True)
class Piece:
    """A stretch of one line: ``changed`` when it was removed (old side) or added (new)."""

    text: str
    changed: bool


@dataclass(frozen=True)
class Line:
    """One line of the inline view. ``kind``: same, remove, add or skip (unchanged lines
    left out); ``old_no``/``new_no``: its number in either text."""

    kind: str
    old_no: int | None
    new_no: int | None
    pieces: tuple[Piece, ...]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


@dataclass(frozen=True)
class Row:
    """One row of the side-by-side view. ``kind``: same, change, remove, add or skip."""

    kind: str
    left_no: int | None
    left: tuple[Piece, ...]
    right_no: int | None
    right: tuple[Piece, ...]


def words(old: str, new: str) -> tuple[tuple[Piece, ...], tuple[Piece, ...]]:
    """``old`` and ``new`` (one line each) cut into pieces, the differing words marked."""
    if max(len(old), len(new)) > WORD_DIFF_MAX_CHARS:
        return _whole(old), _whole(new)
    a, b = _TOKEN.findall(old), _TOKEN.findall(new)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if matcher.ratio() < WORD_DIFF_MIN_RATIO:
        return _whole(old), _whole(new)
    left: list[Piece] = []
    right: list[Piece] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        same = tag == "equal"
        _add(left, "".join(a[i1:i2]), not same)
        _add(right, "".join(b[j1:j2]), not same)
    return _joined(left), _joined(right)


def inline(old: str, new: str, context: int = CONTEXT, max_rows: int = MAX_ROWS) -> list[Line]:
    """The changed lines of ``old`` → ``new`` with ``context`` lines around each change;
    a replaced line comes as its old line then its new one, the changed words marked.
    Empty when the texts are equal."""
    out: list[Line] = []
    for block in _blocks(old.splitlines(), new.splitlines(), context):
        if out:
            out.append(Line("skip", None, None, (Piece("…", False),)))
        for tag, pairs in block:
            if tag == "same":
                out += [Line("same", i, j, left) for i, j, left, _ in pairs]
                continue
            removed = [Line("remove", i, None, lp) for i, _, lp, _ in pairs if i is not None]
            added = [Line("add", None, j, rp) for _, j, _, rp in pairs if j is not None]
            out += removed + added
        if len(out) > max_rows:
            return [
                *out[:max_rows],
                Line("skip", None, None, (Piece("… more changes not shown", False),)),
            ]
    return out


def side_by_side(old: str, new: str, context: int = CONTEXT, max_rows: int = MAX_ROWS) -> list[Row]:
    """Old and new lines next to each other, unchanged stretches cut to ``context`` lines,
    the changed words of each replaced line marked on both sides."""
    rows: list[Row] = []
    for block in _blocks(old.splitlines(), new.splitlines(), context):
        if rows:
            rows.append(Row("skip", None, (Piece("…", False),), None, (Piece("…", False),)))
        for tag, pairs in block:
            for i, j, left, right in pairs:
                if tag == "same":
                    kind = "same"
                elif i is not None and j is not None:
                    kind = "change"
                else:
                    kind = "remove" if j is None else "add"
                rows.append(Row(kind, i, left, j, right))
        if len(rows) > max_rows:
            more = (Piece("… more changes not shown", False),)
            return [*rows[:max_rows], Row("skip", None, more, None, ())]
    return rows


# A block is a group of opcodes around changes, each ("same" or "change", its lines as
# (old number, new number, old pieces, new pieces)): numbers from 1, None where a side
# has no line.
_Pair = tuple[int | None, int | None, tuple[Piece, ...], tuple[Piece, ...]]


def _blocks(a: list[str], b: list[str], context: int) -> Iterator[list[tuple[str, list[_Pair]]]]:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        block: list[tuple[str, list[_Pair]]] = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                pairs: list[_Pair] = [
                    (i + 1, j + 1, (Piece(a[i], False),), (Piece(b[j], False),))
                    for i, j in zip(range(i1, i2), range(j1, j2), strict=True)
                ]
                block.append(("same", pairs))
                continue
            left, right = list(range(i1, i2)), list(range(j1, j2))
            pairs = []
            for k in range(max(len(left), len(right))):
                li = left[k] if k < len(left) else None
                rj = right[k] if k < len(right) else None
                if li is not None and rj is not None:
                    lp, rp = words(a[li], b[rj])
                else:
                    lp = _whole(a[li]) if li is not None else ()
                    rp = _whole(b[rj]) if rj is not None else ()
                pairs.append((_number(li), _number(rj), lp, rp))
            block.append(("change", pairs))
        yield block


def _number(index: int | None) -> int | None:
    return index + 1 if index is not None else None


def _whole(text: str) -> tuple[Piece, ...]:
    return (Piece(text, True),) if text else ()


def _joined(pieces: list[Piece]) -> tuple[Piece, ...]:
    """A space between two changed stretches joins them: "in stock" -> "sold out" marks
    two words each, not two stretches around a space that did not change."""
    out: list[Piece] = []
    for n, piece in enumerate(pieces):
        between = 0 < n < len(pieces) - 1 and pieces[n - 1].changed and pieces[n + 1].changed
        _add(out, piece.text, piece.changed or (between and piece.text.isspace()))
    return tuple(out)


def _add(pieces: list[Piece], text: str, changed: bool) -> None:
    if not text:
        return
    if pieces and pieces[-1].changed == changed:
        pieces[-1] = Piece(pieces[-1].text + text, changed)
    else:
        pieces.append(Piece(text, changed))


__all__ = ["CONTEXT", "MAX_ROWS", "Line", "Piece", "Row", "inline", "side_by_side", "words"]
