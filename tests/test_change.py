"""Change detection within one check: what varies is learned, a real edit is confirmed.

:class:`~crawler_app.checking.confirm.ViewCheck` is fed the texts of a check's fetches, as
the agent feeds it; the end-to-end runs with real agents are in test_noise.py
and test_detection.py.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from crawler_app.checking.change import diff, short_diff
from crawler_app.checking.confirm import (
    BASELINE,
    CHANGE,
    NOISE,
    RISK,
    SAME,
    Known,
    ViewCheck,
    fetches_to_confirm,
)
from crawler_app.checking.variance import Model, text_keys
from crawler_app.fetching.pagekind import built_by_script, error_page
from crawler_app.fetching.text import fingerprint

CONFIRMS = 4
PAGE = "Shop\nOpening hours\nMon-Fri 9-17\nSat 10-14\nAd: shoes\nServer time 12:00:01"


def check(model: Model, *texts: str, known: frozenset[str] = frozenset()) -> ViewCheck:
    """A view's check fed ``texts`` until it settles (as the agent stops fetching)."""
    view = ViewCheck(Known(known, model), CONFIRMS)
    for text in texts:
        view.add(text, fingerprint(text, normalised=True))
        if view.settled:
            break
    view.finish()
    return view


def baseline(*texts: str) -> Model:
    view = check(Model(), *texts)
    assert view.verdict == BASELINE and view.model is not None
    return view.model


def test_a_baseline_comes_from_two_fetches_and_learns_what_varies_between_them() -> None:
    model = baseline(PAGE, PAGE.replace("shoes", "hats").replace("00:01", "00:07"))
    assert model.has_base and len(model.vary) == 2 and len(model.tpl) == 1
    # Another ad and another time: noise at the first fetch, nothing fetched again.
    again = check(model, PAGE.replace("shoes", "boots").replace("00:01", "03:33"))
    assert (again.verdict, len(again.texts)) == (SAME, 1)


def test_a_rotating_slot_first_seen_varying_is_noise() -> None:
    model = baseline(PAGE, PAGE)
    ads = [PAGE.replace("shoes", ad) for ad in ("hats", "boots", "socks")]
    view = check(model, *ads)
    assert view.verdict == NOISE and len(view.texts) == 2
    assert view.model is not None and check(view.model, PAGE.replace("shoes", "belts")).verdict in (
        SAME,
        NOISE,
    )


def test_an_edit_in_a_stable_line_is_a_change_after_every_confirming_fetch() -> None:
    model = baseline(PAGE, PAGE.replace("00:01", "00:02"))
    edited = [PAGE.replace("10-14", "closed").replace("00:01", f"01:0{i}") for i in range(9)]
    view = check(model, *edited)
    assert view.verdict == CHANGE and len(view.texts) == 1 + CONFIRMS
    assert view.model is not None and "closed" in view.texts[-1]


def test_confirming_takes_fewer_fetches_as_a_view_is_seen_more() -> None:
    needed = [fetches_to_confirm(seen, CONFIRMS) for seen in range(40)]
    assert needed[:3] == [CONFIRMS] * 3 and needed[-1] == 1
    assert needed == sorted(needed, reverse=True)
    for seen, n in enumerate(needed):
        # A variant shown on a share p of requests, unseen so far and then shown in
        # every fetch of the check: worst case over p within the accepted risk, and
        # one fetch fewer would exceed it.
        worst = max((1 - p) ** seen * p**n for p in (i / 1000 for i in range(1, 1000)))
        assert n == CONFIRMS or worst <= RISK
        if n > 1:
            fewer = max((1 - p) ** seen * p ** (n - 1) for p in (i / 1000 for i in range(1, 1000)))
            assert fewer > RISK


def test_an_edit_on_a_view_seen_many_times_is_confirmed_by_fewer_fetches() -> None:
    model = dataclasses.replace(baseline(PAGE, PAGE), seen=10)
    edited = [PAGE.replace("10-14", "closed")] * 9
    view = check(model, *edited)
    assert view.verdict == CHANGE and len(view.texts) == 1 + fetches_to_confirm(10, CONFIRMS) == 3
    # The count travels with the model (the master adds each check's fetches).
    assert view.model is not None and view.model.seen == 10
    assert Model.from_json(view.model.to_json()).seen == 10


def test_a_new_block_and_a_removed_block_are_changes() -> None:
    model = baseline(PAGE, PAGE)
    assert check(model, *[PAGE + "\nNew: umbrellas"] * 9).verdict == CHANGE
    assert check(model, *[PAGE.replace("Sat 10-14\n", "")] * 9).verdict == CHANGE


def test_a_banner_that_comes_and_goes_is_noise_and_learned() -> None:
    model = baseline(PAGE, PAGE)
    banner = "We use cookies. Accept?\n" + PAGE
    view = check(model, banner, banner, PAGE)
    assert view.verdict == NOISE and view.model is not None
    assert check(view.model, banner).verdict == SAME


def test_a_relative_date_that_ticks_is_never_a_change() -> None:
    model = baseline(PAGE + "\nPosted 3 days ago", PAGE + "\nPosted 3 days ago")
    assert check(model, PAGE + "\nPosted 4 days ago").verdict == SAME


@given(st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=1 + CONFIRMS))
def test_a_change_is_backed_by_every_fetch_of_its_check(variants: list[str]) -> None:
    model = baseline(PAGE, PAGE)
    texts = [PAGE + f"\nVariant {v}" for v in variants]
    view = check(model, *texts)
    if view.verdict == CHANGE:  # the same new line in every fetch made
        assert len(set(view.texts)) == 1
    else:
        assert view.verdict == NOISE and len(set(view.texts)) > 1


def test_error_pages_served_with_200_are_told_from_content() -> None:
    model = Model().rebased(text_keys(PAGE))
    assert error_page("Down", "We are down for maintenance. Back soon.", model)
    assert error_page(None, "502 Bad Gateway", Model())
    assert error_page(None, "  ", model)
    # A page that keeps its content and adds a notice is content.
    assert error_page(None, PAGE + "\nScheduled maintenance on Sunday", model) is None
    assert error_page(None, PAGE, model) is None


def test_a_page_built_by_its_scripts_is_recognised() -> None:
    assert built_by_script(b"<div id=app></div><script src=app.js></script>", "")
    assert not built_by_script(b"<p>plenty of text</p><script></script>", "x" * 500)
    assert not built_by_script(b"<p>short</p>", "short")


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
