"""One view of one page across the fetches of one check: same, noise, change or baseline.

The agent's ``check_page`` fetches a page once; a view whose text is not its
baseline (its exact fingerprint, or its masked form, :mod:`crawler_app.checking.variance`)
makes the agent fetch the page again after a short delay, up to a number of
times, all inside the same job and the same per-host politeness. A
:class:`ViewCheck` follows one view over these fetches and says when it is
settled:

``same``      the first fetch equals the baseline (exactly, or once masked);
``noise``     the fetches differ from the baseline only where they differ from
              each other (what varies is learned into the model);
``change``    lines added in every fetch, or baseline lines gone from every
              fetch, after the last fetch allowed: the users are told;
``baseline``  no baseline yet: the fetches (at least two, so what varies is
              learned at once) give one.

Confirming fetches are unconditional: a ``304`` from one CDN edge says nothing
about what another edge served.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .check_result import ViewResult
from .variance import Model, judge, text_keys

SAME = "same"
NOISE = "noise"
CHANGE = "change"
BASELINE = "baseline"

#: Seconds between the fetches of one check (the page's own noise shows in them).
DEFAULT_CONFIRM_DELAY = 5.0
#: Fetches one check may add to confirm a difference (at most; fewer once the view's
#: fetches so far make a rare variant unlikely, :func:`fetches_to_confirm`). A
#: difference that is noise goes away on the next fetch with a chance of 1 - p (p: how
#: often the variant shows); one that holds through n fetches is noise with a chance
#: of p^n: 4 keeps that under 3 % for a cookie banner shown on 40 % of requests the
#: first time it is seen, and a learned variant never costs a fetch again.
DEFAULT_CONFIRM_FETCHES = 4
#: The chance of a false alert that confirming accepts, at worst over how often a
#: variant shows: that of a view's first check after its baseline (seen twice,
#: confirmed by 4 fetches, :func:`fetches_to_confirm`).
RISK = 0.022
#: Fetches added to a new view's first fetch, to learn what varies from the start.
BASELINE_FETCHES = 1
#: Seconds before that added fetch. None: it learns what varies per request (a rotating
#: ad, a banner, a served-by stamp); what varies with time shows in the first checks'
#: confirming fetches, spaced by the delay, and is learned there at the same cost. A
#: delay here would hold an agent's slot idle for every new page: a bulk of new pages
#: would be checked at slots / delay pages per second (20/s for 100 slots and 5 s).
BASELINE_DELAY = 0.0


def fetches_to_confirm(seen: int, most: int) -> int:
    """Fetches that confirm a difference on a view seen ``seen`` times before (at most
    ``most``).

    A variant shown on a share p of requests went unseen in ``seen`` fetches and then
    showed in n in a row with a chance of (1 - p)^seen * p^n, at worst (over p) at
    p = n / (seen + n). The fewest n that keep that worst case under :data:`RISK`:
    4 after a baseline's two fetches, 3 after three, 2 from four, 1 from seventeen. So a
    page that has shown its noise, or shown none, over many checks confirms an edit
    in one or two fetches.
    """
    for n in range(1, most):
        p = n / (seen + n)
        if (1 - p) ** seen * p**n <= RISK:
            return n
    return most


@dataclass(frozen=True)
class Known:
    """What the master knows of a view: exact fingerprints of its baseline, its model."""

    fingerprints: frozenset[str]
    model: Model
    #: False for a one-off fetch (the web UI's): a first fetch is taken as it is.
    learn: bool = True

    @classmethod
    def from_payload(cls, value: Any) -> Known:
        """From the payload's per-view value: a dict, or a list of fingerprints (one-off)."""
        if isinstance(value, dict):
            return cls(frozenset(value.get("known") or ()), Model.from_json(value.get("model")))
        return cls(frozenset(value or ()), Model(), learn=False)


@dataclass
class ViewCheck:
    """One view over the fetches of one check (see the module doc)."""

    known: Known
    confirm_fetches: int
    texts: list[str] = field(default_factory=list)
    keys: list[list[tuple[str, str | None]]] = field(default_factory=list)
    verdict: str | None = None
    model: Model | None = None

    def add(self, text: str, fingerprint: str) -> None:
        """One more good fetch of the view; settles it when it can."""
        if self.verdict is not None:
            return
        model = self.known.model
        self.texts.append(text)
        if not self.texts[1:] and fingerprint in self.known.fingerprints and model.has_base:
            self.verdict = SAME
            return
        self.keys.append(text_keys(text))
        if not model.has_base:
            if len(self.keys) > BASELINE_FETCHES or not self.known.learn:
                learned = judge(model, self.keys).model
                self.model = learned.rebased(self.keys[-1])
                self.verdict = BASELINE
            return
        found = judge(model, self.keys)
        if not found.changed:
            self.verdict = SAME if len(self.keys) == 1 else NOISE
            self.model = found.model if found.learned else None
        elif len(self.keys) > fetches_to_confirm(model.seen, self.confirm_fetches):
            self.model = found.model.rebased(self.keys[-1])
            self.verdict = CHANGE

    def finish(self) -> None:
        """No more fetches: an unsettled view keeps what its fetches showed."""
        if self.verdict is not None or not self.keys:
            return
        if not self.known.model.has_base:
            self.model = judge(Model(), self.keys).model.rebased(self.keys[-1])
            self.verdict = BASELINE
            return
        found = judge(self.known.model, self.keys)
        if found.changed:
            self.model = found.model.rebased(self.keys[-1])
            self.verdict = CHANGE
        else:
            self.verdict = NOISE
            self.model = found.model if found.learned else None

    @property
    def settled(self) -> bool:
        return self.verdict is not None

    @property
    def baseline(self) -> bool:
        """Whether this check takes the view's first baseline (its fetches learn what
        varies per request, one right after another: :data:`BASELINE_DELAY`)."""
        return self.known.learn and not self.known.model.has_base

    def result(self, view: ViewResult) -> ViewResult:
        """``view`` (the last fetch's fingerprint, chars, ...) with the verdict and model."""
        return replace(
            view,
            verdict=self.verdict,
            fetches=len(self.texts),
            # only a new baseline or a change is stored
            text=self.texts[-1] if self.verdict in (CHANGE, BASELINE) else None,
            model=self.model.to_json() if self.model is not None else view.model,
        )
