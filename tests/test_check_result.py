"""The ``check_page`` result as a record (crawler_app/checking/check_result.py): the JSON the
family returns keeps the shape the log, the analysis and the API have always read."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from crawler_app.checking.analysis import decode_result
from crawler_app.checking.check_result import STATUS_FIELDS, CheckResult, ViewResult
from crawler_app.checking.confirm import BASELINE, Known, ViewCheck
from crawler_app.checking.variance import Model


def fetched(**more: Any) -> dict[str, Any]:
    """A fetcher's result, as ``Fetcher.fetch_with_body`` returns it."""
    out: dict[str, Any] = {name: None for name in STATUS_FIELDS}
    out.update(url="https://example.org/", final_url="https://example.org/", status=200)
    out.update(ok=True, not_modified=False, size=5, truncated=False, redirects=["a"])
    out.update(text="hello", fingerprint="f" * 64)
    out.update(more)
    return out


def test_a_failed_fetch_is_its_status_fields_and_redirects() -> None:
    raw = fetched(ok=False, status=500, error="http_error", error_message="500")
    out = CheckResult.of_fetch(raw).to_json()
    assert list(out) == [*STATUS_FIELDS, "redirects"]
    assert out["error"] == "http_error" and out["redirects"] == 1 and out["ok"] is False


def test_a_rendered_fetch_carries_browser_even_when_the_rendering_did_not_start() -> None:
    out = CheckResult.of_fetch(fetched(ok=False), rendered=True).to_json()
    assert "browser" in out and out["browser"] is None
    tally = {"requests": 3, "refused": 1, "examples": []}
    result = CheckResult.of_fetch(fetched(browser=tally), rendered=True)
    assert result.refused_requests == 1
    assert CheckResult.of_fetch(fetched(browser=tally)).to_json().get("browser") is None


def test_a_good_check_has_its_views_judged_and_its_fetches() -> None:
    check = ViewCheck(Known(frozenset(), Model(), learn=False), 2)
    check.add("hello", "f" * 64)
    view = check.result(ViewResult("f" * 64, 5, None, "hello"))
    bad = ViewCheck(Known(frozenset(), Model()), 2).result(ViewResult(error="bad selector"))
    result = replace(
        CheckResult.of_fetch(fetched()),
        script_page=False,
        views={"": view, "css:p": bad},
        fetches=1,
    )
    out = result.to_json()
    assert list(out)[-4:] == ["redirects", "script_page", "views", "fetches"]
    whole = out["views"][""]
    assert list(whole)[:6] == ["fingerprint", "chars", "matches", "text", "verdict", "fetches"]
    assert whole["verdict"] == BASELINE and whole["text"] == "hello" and "model" in whole
    assert out["views"]["css:p"] == {"error": "bad selector", "verdict": None, "fetches": 0}


def test_the_json_reads_back_as_the_record() -> None:
    view = ViewResult("f" * 64, 5, 2, "hello", True, "change", 3, {"seen": "4"})
    result = replace(
        CheckResult.of_fetch(fetched(), rendered=True),
        browser={"requests": 1, "refused": 0},
        script_page=True,
        views={"css:p": view, "bad": ViewResult(error="no", verdict=None, fetches=0)},
        fetches=3,
    )
    assert CheckResult.from_json(result.to_json()) == result


def test_a_result_of_an_older_family_or_a_broken_one_reads() -> None:
    old = decode_result('{"ok": true, "status": 200, "views": {"": {"fingerprint": "x"}}}')
    assert old.ok and old.views == {"": ViewResult(fingerprint="x")}
    assert old.script_page is None and old.refused_requests is None
    for bad in ("not json", "[1, 2]"):
        broken = decode_result(bad)
        assert not broken.ok and broken.error == "internal_error"
    assert decode_result(None) == CheckResult()
