"""Changes as users see them: the diff of two snapshots, full and short.

*Whether* a view changed is decided on the agent, over the fetches of one check
(:mod:`crawler_app.checking.confirm`, with what varies learned per view in
:mod:`crawler_app.checking.variance`); the master stores the verdict
(:mod:`crawler_app.checking.analysis`). :func:`diff` and :func:`short_diff` render a
change for the history page and for e-mails.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from .variance import Model

#: Lines of context around each change in :func:`diff`.
DEFAULT_CONTEXT = 3
#: Largest diff kept, in lines and in characters.
MAX_DIFF_LINES = 2000
MAX_DIFF_CHARS = 200_000
#: Size of the short diff put in e-mails.
SHORT_DIFF_LINES = 12
SHORT_DIFF_LINE_CHARS = 200


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
    model: Model | None = None,
    max_lines: int = SHORT_DIFF_LINES,
    line_chars: int = SHORT_DIFF_LINE_CHARS,
) -> str:
    """The removed (``- ``) and added (``+ ``) lines only, few and shortened, for e-mails.

    With the view's ``model``, lines learned to vary (a rotating ad, a clock) are left
    out and lines are compared as the change detection compares them (relative dates
    blanked): a digest shows the edit, not the noise around it.
    """
    old, new = old_text.splitlines(), new_text.splitlines()
    key: Callable[[str], str] = str
    if model is not None:
        old = [line for line in old if not model.varies(line)]
        new = [line for line in new if not model.varies(line)]
        key = model.line_key
    matcher = difflib.SequenceMatcher(None, [key(x) for x in old], [key(x) for x in new])
    changed: list[str] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        for sign, lines in (("-", old[i1:i2]), ("+", new[j1:j2])):
            for body in lines:
                if len(body) > line_chars:
                    body = body[: line_chars - 1] + "…"
                changed.append(f"{sign} {body}")
    return "\n".join(_limit(changed, max_lines, max_lines * (line_chars + 3)))
