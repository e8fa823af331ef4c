"""Confirmed change detection: noise and flips never alert, a real edit does, once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypothesis import given
from hypothesis import strategies as st

from crawler_app.change import (
    BASELINE,
    CANDIDATE,
    CONFIRMED,
    EMPTY_FINGERPRINT,
    FLIP,
    IGNORED,
    UNCHANGED,
    decide,
    diff,
    short_diff,
)
from crawler_app.fetcher import Fetcher, FetchSettings
from crawler_app.text import fingerprint

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)


@dataclass
class Tracked:
    """What the application stores for one page between cycles."""

    history: list[str] = field(default_factory=list)  # snapshot fingerprints, newest first
    pending: str | None = None
    last_fetched: str | None = None
    verdicts: list[str] = field(default_factory=list)
    notifications: int = 0

    def check(self, text: str | None, *, not_modified: bool = False) -> str:
        new = self.last_fetched if not_modified else (None if text is None else fingerprint(text))
        decision = decide(new, self.history, self.pending)
        self.pending = decision.pending
        if new is not None:
            self.last_fetched = new
        if decision.store_snapshot:
            assert new is not None
            self.history.insert(0, new)
        self.notifications += decision.notify
        self.verdicts.append(decision.verdict)
        return decision.verdict


def test_the_rule_step_by_step() -> None:
    a, b, c = fingerprint("A"), fingerprint("B"), fingerprint("C")
    assert decide(a, []).verdict == BASELINE and decide(a, []).store_snapshot
    assert decide(a, [a]).verdict == UNCHANGED
    first = decide(b, [a])
    assert (first.verdict, first.pending, first.notify) == (CANDIDATE, b, False)
    second = decide(b, [a], pending=b)
    assert (second.verdict, second.pending, second.notify, second.store_snapshot) == (
        CONFIRMED,
        None,
        True,
        True,
    )
    assert decide(c, [a], pending=b) == decide(c, [a])  # another new text restarts the wait
    assert decide(a, [b, a], pending=c).verdict == FLIP
    assert decide(a, [b, a], pending=c).pending is None
    assert decide(a, [a], pending=b).pending is None  # back to the snapshot: noise dropped


def test_errors_and_empty_bodies_never_count_and_keep_the_candidate() -> None:
    a, b = fingerprint("A"), fingerprint("B")
    for new in (None, EMPTY_FINGERPRINT, fingerprint("")):
        decision = decide(new, [a], pending=b)
        assert (decision.verdict, decision.pending, decision.notify) == (IGNORED, b, False)
    assert decide(None, []).store_snapshot is False


def test_a_noisy_page_never_confirms_over_ten_cycles() -> None:
    page = Tracked()
    for cycle in range(10):
        page.check(f"Prices: tea 3\nGenerated at 10:{cycle:02d}")
    assert page.notifications == 0
    assert page.verdicts == [BASELINE] + [CANDIDATE] * 9
    assert len(page.history) == 1


def test_a_page_flipping_between_states_never_confirms() -> None:
    page = Tracked()
    for cycle in range(10):
        page.check("Banner: summer sale" if cycle % 2 else "Banner: free shipping")
    assert page.notifications == 0
    assert page.verdicts == [BASELINE] + [CANDIDATE, UNCHANGED] * 4 + [CANDIDATE]


def test_a_slow_flip_confirms_once_then_is_recognised() -> None:
    page = Tracked()
    states = ["A", "A", "B", "B", "A", "A", "B", "B", "A", "A"]  # each state held two cycles
    for text in states:
        page.check(text)
    # The first switch to B looks like an edit; every later switch is a known state.
    assert page.notifications == 1
    assert page.verdicts[4:] == [FLIP, FLIP, UNCHANGED, UNCHANGED, FLIP, FLIP]


def test_errors_between_sightings_do_not_reset_confirmation() -> None:
    page = Tracked()
    for text in ["old", "old", "new", None, "", "new"]:
        page.check(text)
    assert page.verdicts == [BASELINE, UNCHANGED, CANDIDATE, IGNORED, IGNORED, CONFIRMED]
    assert page.notifications == 1


def test_a_real_edit_confirms_on_the_second_fetch_and_alerts_once() -> None:
    page = Tracked()
    texts = ["Opening hours: 9-17"] * 3 + ["Opening hours: 10-18"] * 7
    for text in texts:
        page.check(text)
    assert page.verdicts == [BASELINE, UNCHANGED, UNCHANGED, CANDIDATE, CONFIRMED] + [UNCHANGED] * 5
    assert page.notifications == 1


@given(st.lists(st.sampled_from(["A", "B", "C", None]), max_size=30))
def test_every_notification_is_backed_by_two_equal_fetches_in_a_row(
    texts: list[str | None],
) -> None:
    page = Tracked()
    seen: list[str] = []  # successful fetch texts, in order
    for text in texts:
        verdict = page.check(text)
        if text is not None:
            seen.append(text)
        if verdict == CONFIRMED:
            assert len(seen) >= 2 and seen[-1] == seen[-2]
            assert len(page.history) >= 2 and page.history[0] != page.history[1]
    assert page.notifications == page.verdicts.count(CONFIRMED)


def test_fetched_pages_over_ten_cycles(site: TestSite) -> None:
    """Noise, flips and an edit served by a real site, fetched with validators."""
    config = FetchSettings(allow_networks=("127.0.0.0/8",), per_host_interval=0)
    pages = {name: Tracked() for name in ("/clock", "/flip", "/edited")}
    validators: dict[str, dict[str, Any]] = {name: {} for name in pages}

    def serve(cycle: int) -> None:
        site.set_page("/clock", f"<p>News</p><p>Rendered at 12:{cycle:02d}</p>")
        flip_text = "Variant A" if cycle % 2 else "Variant B"
        site.set_page("/flip", f"<p>{flip_text}</p>", headers={"ETag": f'"{flip_text}"'})
        body = "Price: 12" if cycle < 6 else "Price: 15"
        site.set_page("/edited", f"<p>{body}</p>", headers={"ETag": f'"{body}"'})

    async def run_cycles() -> None:
        async with Fetcher(config) as fetcher:
            for cycle in range(10):
                serve(cycle)
                for name, page in pages.items():
                    result = await fetcher.fetch(site.url(name), **validators[name])
                    assert result["ok"], result
                    if not result["not_modified"]:
                        validators[name] = {"etag": result["etag"]}
                    page.check(result["text"], not_modified=result["not_modified"])

    asyncio.run(run_cycles())
    assert pages["/clock"].notifications == 0
    assert pages["/flip"].notifications == 0
    assert pages["/edited"].notifications == 1
    assert pages["/edited"].verdicts[6:8] == [CANDIDATE, CONFIRMED]
    # The unchanged cycles of /edited were answered 304 without a body.
    not_modified = [r for r in site.wait_requests("/edited", 10) if r.status == 304]
    assert len(not_modified) == 8 and not any(r.body_sent for r in not_modified)


def test_diff_is_unified_and_limited() -> None:
    old = "\n".join(f"line {i}" for i in range(50))
    new = old.replace("line 25", "line twenty-five")
    text = diff(old, new, context=1)
    assert text.splitlines()[:2] == ["--- before", "+++ after"]
    assert "-line 25" in text and "+line twenty-five" in text
    assert "line 10" not in text
    assert diff(old, old) == ""
    huge = diff("", "\n".join(str(i) for i in range(10_000)), max_lines=100)
    assert len(huge.splitlines()) == 101 and huge.splitlines()[-1].endswith("not shown")
    assert len(diff("", "x" * 10_000 + "\ny", max_chars=500)) < 600


def test_short_diff_for_emails() -> None:
    old = "Title\nPrice: 12\nFooter"
    new = "Title\nPrice: 15\nFooter\n" + "\n".join(f"extra {i}" for i in range(30))
    text = short_diff(old, new, max_lines=5)
    lines = text.splitlines()
    assert lines[:2] == ["- Price: 12", "+ Price: 15"]
    assert len(lines) == 6 and lines[-1].endswith("not shown")
    assert short_diff("a", "b" * 1000, line_chars=50).splitlines()[1] == "+ " + "b" * 49 + "…"
    assert short_diff("same", "same") == ""
