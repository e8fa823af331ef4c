"""A corpus of noisy pages with known real edits, served per request by a :class:`TestSite`.

Each page is a function of the request number, the cycle and a random generator
(one per page, seeded): random variants per request (a rotating ad of 5, an A/B
layout, a cookie banner on 40 % of requests, a quote of the day), states that
hold for two fetches or more (a relative date ticking once, a status-200
maintenance page on two cycles, CDN edges with a served-by stamp, one of them
answering 304), per-request noise (a live clock, a view counter) with a real
edit, and quiet pages. :data:`EDITS` says which page is edited in which cycle:
any other alert is a false one. Used by tests/test_detection.py and
bench/detection.py.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker

from crawler_app.checking.cycle import CycleResult
from crawler_app.models import Page, Snapshot
from crawler_app.users import pages

if TYPE_CHECKING:
    from tests.site import TestSite

ARTICLE = (
    "<h1>Opening hours</h1><p>Our shop is open Monday to Friday from 9 to 17.</p>"
    "<p>On Saturdays we open from 10 to 14.</p><p>Prices: coffee 3 EUR, tea 2 EUR.</p>"
)
ADS = ["Sale on shoes", "New: umbrellas", "Free delivery", "Two for one", "Gift cards"]
QUOTES = ["Carpe diem.", "Less is more.", "Know thyself.", "Time is money."]
#: path -> the cycle in which a real edit is made (the page keeps it afterwards).
EDITS = {"/clock-edit": 5, "/counter-edit": 7, "/ad-edit": 6, "/banner-block": 4, "/plain": 2}

Make = Callable[[int, int, random.Random], dict[str, Any]]


def doc(body: str, title: str = "Shop") -> dict[str, Any]:
    return {"body": f"<html><head><title>{title}</title></head><body>{body}</body></html>"}


def _edited(path: str, cycle: int) -> bool:
    return cycle >= EDITS.get(path, 10**9)


def _ab(n: int, cycle: int, rng: random.Random) -> dict[str, Any]:
    nav = "<nav>Home | Shop | Contact</nav>"
    if rng.random() < 0.5:
        return doc(f"{nav}<article>{ARTICLE}</article><aside>Related: gifts</aside>")
    return doc(f"<article>{ARTICLE}</article><div>Menu</div>{nav}<aside>See also: gifts</aside>")


def _cdn(n: int, cycle: int, rng: random.Random, headers: dict[str, str]) -> dict[str, Any]:
    edge = rng.choice(["fra-1", "ams-2"])
    etag = f'"{edge}-v1"'
    if headers.get("if-none-match") == etag:
        return {"status": 304, "headers": {"ETag": etag}}
    page = doc(f"{ARTICLE}<footer>Served by edge {edge}</footer>")
    return {**page, "headers": {"ETag": etag}}


PAGES: dict[str, Make] = {
    "/ad": lambda n, c, r: doc(f"<div class=ad>{r.choice(ADS)}</div>{ARTICLE}"),
    "/ab": _ab,
    "/cookie": lambda n, c, r: doc(
        ("<div id=cookies>We use cookies. Accept all?</div>" if r.random() < 0.4 else "") + ARTICLE
    ),
    "/quote": lambda n, c, r: doc(f"{ARTICLE}<blockquote>{r.choice(QUOTES)}</blockquote>"),
    "/reldate": lambda n, c, r: doc(f"{ARTICLE}<p>Updated {3 if c < 3 else 4} days ago</p>"),
    "/maintenance": lambda n, c, r: (
        doc("<h1>Down for maintenance</h1><p>Back soon.</p>", "Maintenance")
        if c in (4, 5)
        else doc(ARTICLE)
    ),
    "/clock-edit": lambda n, c, r: doc(
        ARTICLE.replace("coffee 3", "coffee 4" if _edited("/clock-edit", c) else "coffee 3")
        + f"<p>Server time 12:{n % 60:02d}:{(n * 7) % 60:02d}</p>"
    ),
    "/counter-edit": lambda n, c, r: doc(
        ARTICLE
        + ("<p>We now sell cakes too.</p>" if _edited("/counter-edit", c) else "")
        + f"<footer>{1000 + n * 37} visits</footer>"
    ),
    "/ad-edit": lambda n, c, r: doc(
        f"<div class=ad>{r.choice(ADS)}</div>"
        + ARTICLE.replace("10 to 14", "10 to 16" if _edited("/ad-edit", c) else "10 to 14")
    ),
    "/banner-block": lambda n, c, r: doc(
        ("<div id=cookies>We use cookies. Accept all?</div>" if r.random() < 0.4 else "")
        + ARTICLE
        + (
            "<section><h2>Holidays</h2><p>Closed on 24 December.</p></section>"
            if _edited("/banner-block", c)
            else ""
        )
    ),  # fmt: skip
    "/plain": lambda n, c, r: doc(
        ARTICLE.replace("tea 2", "tea 3" if _edited("/plain", c) else "tea 2")
    ),
    "/quiet": lambda n, c, r: doc(ARTICLE),
    "/quiet-etag": lambda n, c, r: {**doc(ARTICLE), "headers": {"ETag": '"q1"'}},
}


class Corpus:
    """The corpus served by ``site``; :meth:`set_cycle` moves every page to a cycle."""

    def __init__(self, site: TestSite, seed: int) -> None:
        self.site = site
        self.cycle = 0
        for number, (path, make) in enumerate(sorted(PAGES.items())):
            self._serve(path, make, random.Random(seed * 1000 + number))
        self._serve_cdn(random.Random(seed * 1000 + len(PAGES)))

    def _serve(self, path: str, make: Make, rng: random.Random) -> None:
        self.site.set_maker(path, lambda n, _headers: make(n, self.cycle, rng))

    def _serve_cdn(self, rng: random.Random) -> None:
        self.site.set_maker("/cdn", lambda n, headers: _cdn(n, self.cycle, rng, headers))

    @property
    def paths(self) -> list[str]:
        return sorted([*PAGES, "/cdn"])

    def set_cycle(self, cycle: int) -> None:
        self.cycle = cycle

    def fetches(self) -> int:
        """Requests for corpus pages so far (robots.txt not counted)."""
        return sum(self.fetches_by_path().values())

    def fetches_by_path(self) -> Counter[str]:
        """Requests for each corpus page so far."""
        return Counter(r.path for r in self.site.requests() if r.path in PAGES or r.path == "/cdn")


@dataclass
class Outcome:
    """What the checker made of the corpus over some cycles."""

    false_alerts: list[tuple[str, int]] = field(default_factory=list)  # (path, cycle)
    missed_edits: list[str] = field(default_factory=list)
    delays: dict[str, int] = field(default_factory=dict)  # path -> cycles from edit to alert
    seconds: dict[str, float] = field(default_factory=dict)  # path -> edit to digest, seconds
    fetches: int = 0
    page_cycles: int = 0
    errors: dict[str, list[int]] = field(default_factory=dict)  # path -> cycles with an error
    #: path -> fetches in each cycle.
    fetch_log: dict[str, list[int]] = field(default_factory=dict)

    @property
    def fetches_per_page_cycle(self) -> float:
        return self.fetches / max(1, self.page_cycles)

    @property
    def fetches_per_page_later_cycle(self) -> float:
        """Without the first cycle (each new page's baseline takes two fetches)."""
        later = [n for counts in self.fetch_log.values() for n in counts[1:]]
        return sum(later) / max(1, len(later))


def track_corpus(engine: Engine, corpus: Corpus) -> None:
    """One user per page (so each digest names one page): ``<page>@example.org``."""
    with sessionmaker(engine).begin() as s:
        for path in corpus.paths:
            address = f"{path.strip('/')}@example.org"
            pages.add_user(s, address)
            pages.track(s, address, corpus.site.url(path))


def run_corpus(
    engine: Engine, corpus: Corpus, run_cycle: Callable[[], CycleResult], cycles: int
) -> Outcome:
    """Run ``cycles`` application cycles, the corpus moved to each, and score the alerts."""
    outcome = Outcome()
    urls = {corpus.site.url(path): path for path in corpus.paths}
    alerted: set[str] = set()
    before = corpus.fetches()
    for cycle in range(cycles):
        corpus.set_cycle(cycle)
        started = time.monotonic()
        fetched = corpus.fetches_by_path()
        result = run_cycle()
        seconds = time.monotonic() - started
        fetched = corpus.fetches_by_path() - fetched
        for path in corpus.paths:
            outcome.fetch_log.setdefault(path, []).append(fetched[path])
        with engine.connect() as conn:
            rows = conn.execute(
                select(Page.url, Snapshot.kind)
                .join(Snapshot, Snapshot.page_id == Page.id)
                .where(Snapshot.cycle_id == result.id, Snapshot.kind == "change")
            ).all()
            failed = conn.execute(select(Page.url).where(Page.last_error.is_not(None))).all()
        for (url,) in failed:
            outcome.errors.setdefault(urls[url], []).append(cycle)
        for url, _kind in rows:
            path = urls[url]
            edit = EDITS.get(path)
            if edit is None or cycle < edit or path in alerted:
                outcome.false_alerts.append((path, cycle))
                continue
            alerted.add(path)
            outcome.delays[path] = cycle - edit
            outcome.seconds[path] = round(seconds, 2)  # the edit was live when the cycle began
    outcome.missed_edits = sorted(p for p, c in EDITS.items() if c < cycles and p not in alerted)
    outcome.fetches = corpus.fetches() - before
    outcome.page_cycles = len(corpus.paths) * cycles
    return outcome
