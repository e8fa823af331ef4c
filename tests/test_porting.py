"""Import and export of trackings: urlwatch's urls.yaml and our JSON format, through the
CLI (SQLite and PostgreSQL), all or nothing, within the quota."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from crawler_app import porting
from crawler_app.checking.due import Schedule
from crawler_app.fetching.filters import ViewSpec
from crawler_app.models import Page, Tracking
from crawler_app.users import quota
from crawler_app.users.pages import add_user, get_user, set_paused, track
from crawler_app.users.quota import set_quota
from jodl.cli import main
from jodl.log import make_engine
from jodl.log.migrate import upgrade

ALICE = "alice@example.org"
BOB = "bob@example.org"

#: A urlwatch file of several jobs, in both of urlwatch's filter forms.
URLS_YAML = """\
name: Shop price
url: https://shop.example/item?id=7
filter:
  - css: .price
  - html2text
  - grep: EUR
  - grep-invert: was
max_tries: 3
---
url: https://news.example/
filter: xpath://h1,strip
---
name: API
url: https://api.example/items.json
filter:
  - jsonpath: $.items[*].name
  - exclude: (?i)test
  - exclude: draft
---
url: https://blog.example/feed
filter:
  - css:
      selector: article h2
  - grepi: release
ignore_cached: true
---
url: https://plain.example/
"""


@pytest.fixture
def engine(db_url: str) -> Iterator[object]:
    engine = make_engine(db_url)
    upgrade(engine)
    with sessionmaker(engine).begin() as s:
        add_user(s, ALICE)
        add_user(s, BOB)
    yield engine
    engine.dispose()


def jodl(db_url: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, ["--database-url", db_url, *args], input=stdin)


def count(engine: object, email: str) -> int:
    with Session(engine) as s:  # type: ignore[call-overload]
        user = get_user(s, email)
        return s.scalar(select(func.count()).where(Tracking.user_id == user.id)) or 0


def test_a_urlwatch_file_is_imported_exported_and_reimported_unchanged(
    db_url: str, engine: object, tmp_path
) -> None:
    source = tmp_path / "urls.yaml"
    source.write_text(URLS_YAML)
    done = jodl(db_url, "import", str(source), "--user", ALICE)
    assert done.exit_code == 0, done.output
    assert f"{ALICE}: 5 added, 0 updated, 0 unchanged" in done.stdout
    # What urlwatch had that a tracking does not keep is said, with its line.
    assert "note: line 8: max_tries is urlwatch's own setting" in done.stderr
    assert "name" not in done.stderr, "a job's name is kept"
    with Session(engine) as s:  # type: ignore[call-overload]
        views = {
            p.url: ViewSpec.parse(t.selector)
            for t, p in s.execute(select(Tracking, Page).join(Page)).tuples()
        }
    shop = views["https://shop.example/item?id=7"]
    assert (shop.selector, shop.include, shop.exclude) == (".price", ("EUR",), ("was",))
    assert views["https://news.example/"].selector == "xpath://h1"
    api = views["https://api.example/items.json"]
    assert api.selector == "jsonpath:$.items[*].name"
    assert api.exclude == ("(?i)test", "draft")
    blog = views["https://blog.example/feed"]
    assert (blog.selector, blog.include) == ("article h2", ("(?i)release",))
    assert views["https://plain.example/"].key == ""

    exported = jodl(db_url, "export", "--user", ALICE, "--format", "urlwatch")
    assert exported.exit_code == 0, exported.output
    assert exported.stdout.startswith(f"# urlwatch jobs: the trackings of {ALICE}")
    assert "name: Shop price\nurl: https://shop.example/item?id=7" in exported.stdout
    assert "# Nothing was left out." in exported.stdout
    # The export asks for the same trackings as the file imported.
    again = porting.parse(exported.stdout).checked().specs
    first = porting.parse(URLS_YAML).checked().specs
    assert [(s.url, s.view) for s in again] == sorted((s.url, s.view) for s in first)
    # Imported into another account and exported again: the same file.
    moved = jodl(db_url, "import", "-", "--user", BOB, stdin=exported.stdout)
    assert moved.exit_code == 0, moved.output
    assert f"{BOB}: 5 added" in moved.stdout
    second = jodl(db_url, "export", "--user", BOB, "--format", "urlwatch").stdout
    assert second == exported.stdout.replace(ALICE, BOB)
    # Imported twice: nothing changes, nothing is doubled.
    twice = jodl(db_url, "import", "-", "--user", BOB, "--format", "urlwatch", stdin=second)
    assert f"{BOB}: 0 added, 0 updated, 5 unchanged" in twice.stdout
    assert count(engine, BOB) == 5


def test_our_json_keeps_every_field(db_url: str, engine: object) -> None:
    with sessionmaker(engine).begin() as s:  # type: ignore[call-overload]
        url = "https://shop.example/item"
        track(s, ALICE, url, view=ViewSpec.build(selector=".price"),
              tags=["prices", "work"], period=3)  # fmt: skip
        view = ViewSpec.build(
            selector="//div[@id='stock']",
            include=["left", "stock"],
            exclude=["^Ad"],
            ignore=["Updated", "re:\\d+ visitors"],
            trigger="in stock",
        )
        second = track(s, ALICE, url, view=view, browser=True, schedule=Schedule(every=900))
        second.name = "Stock at the shop"
        set_paused(s, ALICE, url, True, second.id)
        track(s, ALICE, "https://api.example/x.json", view=ViewSpec.build(
            selector="$.price"), tags=["api"], schedule=Schedule(cron="0 */6 * * *"))  # fmt: skip
    exported = jodl(db_url, "export", "--user", ALICE, "--format", "json")
    assert exported.exit_code == 0, exported.output
    doc = json.loads(exported.stdout)
    assert doc["format"] == "jodl-trackings" and doc["version"] == 1
    shop = next(p for p in doc["trackings"] if p["url"] == "https://shop.example/item")
    assert shop["period"] == 3
    assert shop["views"] == [
        {"selector": {"kind": "css", "expression": ".price"}, "include": [], "exclude": [],
         "ignore": [], "trigger": None, "tags": ["prices", "work"], "paused": False,
         "browser": False, "name": None, "every": None, "cron": None},
        {"selector": {"kind": "xpath", "expression": "//div[@id='stock']"},
         "include": ["left", "stock"], "exclude": ["^Ad"],
         "ignore": ["Updated", "re:\\d+ visitors"], "trigger": "in stock", "tags": [],
         "paused": True, "browser": True, "name": "Stock at the shop", "every": 900,
         "cron": None},
    ]  # fmt: skip
    done = jodl(db_url, "import", "-", "--user", BOB, stdin=exported.stdout)
    assert done.exit_code == 0, done.output
    assert f"{BOB}: 3 added, 0 updated, 0 unchanged" in done.stdout
    again = jodl(db_url, "export", "--user", BOB, "--format", "json").stdout
    assert again == exported.stdout
    # The urlwatch export says what it leaves out, at its top.
    yaml_text = jodl(db_url, "export", "--user", BOB, "--format", "urlwatch").stdout
    head = yaml_text.split("---")[0]
    assert "left out here" in head
    for lost in ("tags of 2 trackings", "1 paused tracking", "alert trigger of 1 tracking",
                 "check period of 2 pages", "schedule of 2 trackings"):  # fmt: skip
        assert lost in head, head
    # A tracking the user has is updated to what the file says, not doubled.
    shop["views"][0]["tags"] = ["renamed"]
    changed = jodl(db_url, "import", "-", "--user", BOB, stdin=json.dumps(doc))
    assert f"{BOB}: 0 added, 1 updated, 2 unchanged" in changed.stdout
    assert count(engine, BOB) == 3


BAD_YAML = """\
url: https://fine.example/
---
command: ls -l /etc
---
url: https://shop.example/
filter:
  - css: .price
  - shellpipe: sort
---
url: ftp://files.example/list
"""


def test_an_unmappable_entry_is_named_by_line_and_nothing_is_imported(
    db_url: str, engine: object
) -> None:
    done = jodl(db_url, "import", "-", "--user", ALICE, stdin=BAD_YAML)
    assert done.exit_code == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: nothing imported, 3 entries cannot be mapped: ")
    assert "line 3: command jobs run programs" in line
    assert "line 8: the filter 'shellpipe' has no equivalent" in line
    assert "line 10: 'ftp://files.example/list' is refused" in line
    assert count(engine, ALICE) == 0
    # Our format names the entry by its position.
    doc = {"format": "jodl-trackings", "version": 1, "trackings": [
        {"url": "https://a.example/", "views": [{"selector": None}]},
        {"url": "https://b.example/", "views": [{"selector": None, "colour": "red"}]},
    ]}  # fmt: skip
    refused = jodl(db_url, "import", "-", "--user", ALICE, stdin=json.dumps(doc))
    assert refused.exit_code == 1
    assert "trackings[1].views[0]: colour: no such field of a view" in refused.stderr
    assert count(engine, ALICE) == 0
    # The same page and filters twice in one file: refused too.
    twice = "url: https://a.example/\n---\nurl: https://a.example/\n"
    refused = jodl(db_url, "import", "-", "--user", ALICE, stdin=twice)
    assert "line 3: the same page and filters as line 1" in refused.stderr
    assert count(engine, ALICE) == 0


def test_an_import_over_the_quota_is_refused_whole(db_url: str, engine: object) -> None:
    with sessionmaker(engine).begin() as s:  # type: ignore[call-overload]
        set_quota(s, get_user(s, ALICE), trackings=6)
        track(s, ALICE, "https://old.example/")
        track(s, ALICE, "https://plain.example/")  # in the file: updated, not added
    more = URLS_YAML + "---\nurl: https://x.example/\n"
    done = jodl(db_url, "import", "-", "--user", ALICE, stdin=more)
    assert done.exit_code == 1
    (line,) = done.stderr.strip().splitlines()
    assert f"nothing imported: {ALICE} tracks 2 pages and the file adds 5, more than " in line
    assert count(engine, ALICE) == 2
    # Within the quota (the tracking it has does not count again): imported.
    done = jodl(db_url, "import", "-", "--user", ALICE, stdin=URLS_YAML)
    assert done.exit_code == 0, done.output
    assert f"{ALICE}: 4 added, 0 updated, 1 unchanged" in done.stdout
    assert count(engine, ALICE) == 6


def test_a_refusal_while_writing_leaves_nothing(
    engine: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quota is checked before anything is written; should a tracking still be
    refused part-way (another import of the user's in between lowers the room), the
    savepoint rolls back the trackings written before it."""
    real = quota.limits_of
    calls: list[int] = []

    def shrinking(*args: Any, **kwargs: Any) -> quota.Limits:
        calls.append(1)
        limits = real(*args, **kwargs)
        return limits if len(calls) == 1 else dataclasses.replace(limits, trackings=2)

    # track() asks quota.check_tracking, which reads the limits anew for each tracking.
    monkeypatch.setattr(quota, "limits_of", shrinking)
    text = "".join(f"---\nurl: https://{n}.example/\n" for n in ("a", "b", "c"))
    with sessionmaker(engine).begin() as s:  # type: ignore[call-overload]
        with pytest.raises(quota.QuotaExceeded):
            porting.import_trackings(s, ALICE, porting.parse(text))
        user = get_user(s, ALICE)
        assert s.scalar(select(func.count()).where(Tracking.user_id == user.id)) == 0
    assert len(calls) == 3


def test_urlwatch_forms_that_map_and_those_that_do_not() -> None:
    parsed = porting.parse(
        "navigate: https://spa.example/\n"
        "---\n"
        "url: https://b.example/\n"
        "use_browser: true\n"
        "filter:\n"
        "  - xpath: {path: '//main', method: html}\n"
        "  - html2text: {method: pyhtml2text}\n"
        "  - grepi-invert: {re: ad}\n"
    ).checked()
    spa, b = parsed.specs
    assert (spa.url, spa.browser, spa.view.key) == ("https://spa.example/", True, "")
    assert (b.browser, b.view.selector, b.view.exclude) == (True, "xpath://main", ("(?i)ad",))
    for text, line, why in (
        ("url: https://a.example/\nfilter: grep:a,grep:b\n", 2, "a second grep"),
        ("url: https://a.example/\nfilter:\n  - grep: a\n  - css: p\n", 4, "after a line filter"),
        ("url: https://a.example/\nfilter:\n  - css: p\n  - xpath: //p\n", 4, "a second"),
        ("url: https://a.example/\nheaders: {X: y}\n", 2, "headers: no equivalent"),
        ("url: https://a.example/\nfilter:\n  - css: {selector: p, exclude: b}\n", 3, "css:"),
        ("url: https://a.example/\nfilter: grep:(\n", 2, "invalid regular expression"),
        ("url: [unclosed\n", 2, "not valid YAML"),
    ):
        with pytest.raises(porting.ImportRefused) as refused:
            porting.parse(text).checked()
        (problem,) = refused.value.problems
        assert (problem.line, why in problem.message) == (line, True), problem


def test_several_includes_are_one_grep_in_urlwatch() -> None:
    """A view keeps lines matching any include; urlwatch's greps chain, so the export
    writes one grep of their union (a case-blind one scoped to its own group)."""
    view = ViewSpec.build(include=["(?i)price", "stock"], ignore=["Last visit", "re:^Ad"])
    text = porting.urlwatch.write(
        [porting.spec.Exported("https://a.example/", None, view, (), False, False, 1)], ALICE
    )
    (spec,) = porting.parse(text).checked().specs
    assert spec.view.include == ("(?i:price)|(?:stock)",)
    assert spec.view.exclude == ("(?i)Last\\ visit", "^Ad")
    kept = spec.view.filter_lines("PRICE 3\nLast visit today\nin stock\nAd here\nother")
    assert kept == view.filter_lines("PRICE 3\nLast visit today\nin stock\nAd here\nother")


def test_a_schedule_or_name_our_format_cannot_keep_is_named_by_position() -> None:
    view = {"selector": None, "every": 30, "cron": None}
    doc = {"format": "jodl-trackings", "version": 1,
           "trackings": [{"url": "https://a.example/", "views": [view]},
                         {"url": "https://b.example/", "views": [{"cron": "61 * * * *"}]},
                         {"url": "https://c.example/", "views": [{"name": 7}]}]}  # fmt: skip
    with pytest.raises(porting.ImportRefused) as refused:
        porting.parse(json.dumps(doc)).checked()
    where = [p.where for p in refused.value.problems]
    assert where == ["trackings[0].views[0]", "trackings[1].views[0]", "trackings[2].views[0]"]
    assert "outside the operator's bounds" in str(refused.value.problems[0])
