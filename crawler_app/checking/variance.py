"""What varies on a page: learned per view, left out when texts are compared.

A view's normalised text is a sequence of lines, one per block element
(:mod:`crawler_app.fetching.text`). Each line gets a *key* (a short hash) and, when it
holds digits, a *template key* (the hash of the line with every run of digits
made ``#``). A :class:`Model` keeps, per view:

``base``
    the keys of the baseline's lines (the state users were last told about);
``vary``
    keys of lines seen to come and go while nothing changed (a rotating ad, a
    cookie banner, an A/B variant, a CDN's served-by stamp);
``tpl``
    template keys of lines whose digits were seen to change while nothing
    changed (a clock, a view counter): such a line is compared by its template.

Relative dates ("3 days ago") are never content: they tick once and hold, so no
number of fetches tells them from an edit, and they are blanked before keys are
taken (:data:`RELATIVE_DATE`).

The *masked* form of a text is the set of its line keys (template keys where
learned) less ``vary``. :func:`judge` compares the fetches of one check with the
baseline: a line present in **every** fetch and not in the baseline is added; a
baseline line absent from **every** fetch is removed; lines that differ between
the fetches are learned as variable. Nothing added or removed: noise. The
method and its limits are described in docs/change-detection.md.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

#: Relative dates, blanked before keys are taken (they tick with no edit).
RELATIVE_DATE = re.compile(
    r"\b(?:\d+|an?|one)\s+(?:second|minute|hour|day|week|month|year)s?\s+ago\b"
    r"|\b(?:just now|yesterday|today)\b",
    re.IGNORECASE,
)
_DIGITS = re.compile(r"\d+")
#: Hex digits of a key: 40 bits, so two lines of one page share a key with odds
#: of about n²/2⁴¹ (10⁻⁶ for 1,000 lines), and a payload stays small.
KEY_CHARS = 10
#: Lines of a view kept in its model; a longer text is compared by its first lines.
MAX_LINES = 5000


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:KEY_CHARS]


def line_keys(line: str) -> tuple[str, str | None]:
    """The key of one normalised line and its template key (None without digits)."""
    line = RELATIVE_DATE.sub("\x01", line)
    if not any(c.isdigit() for c in line):
        return _key(line), None
    return _key(line), _key(_DIGITS.sub("#", line))


def text_keys(text: str) -> list[tuple[str, str | None]]:
    """:func:`line_keys` of every line of a normalised text (at most :data:`MAX_LINES`)."""
    return [line_keys(line) for line in text.splitlines()[:MAX_LINES]]


def _encode(keys: Sequence[tuple[str, str | None]]) -> str:
    return " ".join(k if t is None else f"{k}/{t}" for k, t in keys)


def _decode(data: str) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for item in data.split():
        k, _, t = item.partition("/")
        out.append((k, t or None))
    return out


@dataclass(frozen=True)
class Model:
    """A view's baseline and what is known to vary on it (see the module doc)."""

    base: tuple[tuple[str, str | None], ...] = ()
    vary: frozenset[str] = frozenset()
    tpl: frozenset[str] = frozenset()
    #: False until a baseline exists.
    has_base: bool = False
    #: Good fetches of the view seen so far (counted by the master): the more of them
    #: showed no variant of a kind, the rarer that variant can be (how many fetches
    #: confirm a difference, :func:`crawler_app.checking.confirm.fetches_to_confirm`).
    seen: int = 0

    @classmethod
    def from_json(cls, data: dict[str, str] | None) -> Model:
        """The model as :meth:`to_json` stored it (an empty model for None)."""
        if not data or "base" not in data:
            return cls()
        return cls(
            tuple(_decode(data["base"])),
            frozenset(data.get("vary", "").split()),
            frozenset(data.get("tpl", "").split()),
            True,
            int(data.get("seen") or 0),
        )

    def to_json(self) -> dict[str, str]:
        """Plain strings, compact enough to travel in every payload."""
        return {"base": _encode(self.base), "vary": " ".join(sorted(self.vary)),
                "tpl": " ".join(sorted(self.tpl)), "seen": str(self.seen)}  # fmt: skip

    def masked(self, keys: Iterable[tuple[str, str | None]]) -> frozenset[str]:
        """The keys compared: template keys where learned, variable lines left out."""
        out = {t if t is not None and t in self.tpl else k for k, t in keys}
        return frozenset(out - self.vary - self.tpl)

    def varies(self, line: str) -> bool:
        """True for a line learned to vary: left out of comparisons, and of diffs shown."""
        k, t = line_keys(line)
        return k in self.vary or (t is not None and t in self.tpl)

    def line_key(self, line: str) -> str:
        """The key a line is compared by (relative dates blanked; its template where learned)."""
        k, t = line_keys(line)
        return t if t is not None and t in self.tpl else k

    def base_masked(self) -> frozenset[str]:
        return self.masked(self.base)

    def rebased(self, keys: Sequence[tuple[str, str | None]]) -> Model:
        """This model with ``keys`` as its baseline."""
        return replace(self, base=tuple(keys), has_base=True)


@dataclass
class Verdict:
    """What the fetches of one check say about a view.

    ``added``/``removed``: masked keys added in every fetch / gone from every fetch;
    ``model``: the model with what these fetches taught (new ``vary``/``tpl``).
    """

    added: frozenset[str]
    removed: frozenset[str]
    model: Model
    learned: bool = field(default=False)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)


def _replaced_by(base: Sequence[str], fetch: Sequence[str]) -> dict[int, tuple[str, ...]]:
    """For each baseline line missing from ``fetch``, the fetch's lines in its place.

    Lines of a replaced run of equal length pair one to one; otherwise every line of
    the run stands in for every replaced line (none for a deletion).
    """
    out: dict[int, tuple[str, ...]] = {}
    matcher = difflib.SequenceMatcher(None, base, fetch, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op in ("replace", "delete"):
            run = tuple(fetch[j1:j2])
            for i in range(i1, i2):
                one = (run[i - i1],) if len(run) == i2 - i1 else run
                out[i] = one
    return out


def _slot_fills(model: Model, fetch: Sequence[tuple[str, str | None]]) -> set[str]:
    """Keys of ``fetch``'s lines that stand one for one in place of a variable baseline line.

    A slot known to rotate (an ad, a quote) may show a value never seen before; that
    value is noise too. Only a one-for-one replacement counts, so a line added next
    to the slot is still an edit.
    """
    if not model.vary:
        return set()
    base = [k for k, _ in model.base]
    places = _replaced_by(base, [k for k, _ in fetch])
    return {
        place[0] for i, place in places.items()
        if len(place) == 1 and base[i] in model.vary
    }  # fmt: skip


def learn(model: Model, fetches: Sequence[Sequence[tuple[str, str | None]]]) -> Model:
    """``model`` plus what varies between ``fetches`` (keys of one view's fetches).

    A line in some fetches but not all is variable; so is a baseline line whose
    place every fetch fills with such a line (a rotating slot). If another line of
    the same template (digits apart) took a variable line's place, the template is
    learned instead. "Fills": every line in its place varies too, so an edit next
    to a rotating slot is not taken for part of the slot.
    """
    if len(fetches) < 2:
        return model
    sets = [{k for k, _ in f} for f in fetches]
    everywhere = set.intersection(*sets)
    varied = set.union(*sets) - everywhere
    if not varied:
        return model
    base = [k for k, _ in model.base]
    slots: set[str] = set()
    if base:
        places = [_replaced_by(base, [k for k, _ in f]) for f in fetches]
        for i, key in enumerate(base):
            if key in everywhere or key in varied:
                continue
            if all(p.get(i) and all(k in varied for k in p[i]) for p in places):
                slots.add(key)
    templates: dict[str, set[str]] = {}
    for f in (*fetches, model.base):
        for k, t in f:
            if (k in varied or k in slots) and t is not None:
                templates.setdefault(t, set()).add(k)
    tpl = {t for t, ks in templates.items() if len(ks) > 1}
    vary = {
        k for f in (*fetches, model.base) for k, t in f
        if (k in varied or k in slots) and (t is None or t not in tpl)
    }  # fmt: skip
    if vary <= model.vary and tpl <= model.tpl:
        return model
    return replace(model, vary=model.vary | vary, tpl=model.tpl | tpl)


def judge(model: Model, fetches: Sequence[Sequence[tuple[str, str | None]]]) -> Verdict:
    """Compare the fetches of one check with the baseline, learning what varies.

    Fetches that failed are not passed. With no baseline yet everything fetched is
    "added" (the caller stores a baseline).
    """
    learned = learn(model, fetches)
    fills = set().union(*(_slot_fills(learned, f) for f in fetches))
    if fills - learned.vary:
        learned = replace(learned, vary=learned.vary | fills)
    masked = [learned.masked(f) for f in fetches]
    base = learned.base_masked()
    added = frozenset.intersection(*masked) - base
    removed = base - frozenset.union(*masked)
    return Verdict(added, removed, learned, learned is not model)
