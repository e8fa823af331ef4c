"""Filters and triggers per tracking (crawler_app/fetching/filters.py), through real cycles.

A local site serves an HTML page and a JSON document that change between cycles;
users track them through views (CSS, XPath, JSONPath, include, exclude, ignore
text, a trigger). Each view alerts on exactly the change it is meant to see; two
views of one page by one user get their own verdicts while the page is fetched
once per cycle; a bad expression is refused at once, naming it (CLI, API, form);
a selector that stops matching is shown to its tracker.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from app_support import agent_env, app_settings, inbox, run_app_cycle
from click.testing import CliRunner
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker
from test_web_views import login, token

from crawler_app.fetching.filters import FilterError, ViewSpec
from crawler_app.fetching.text import extract
from crawler_app.models import PageView, Snapshot, Tracking, User
from crawler_app.users import pages
from jodl.cli import main
from web.app import create_app
from web.settings import WebSettings

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest

PASSWORD = "correct horse battery"
#: Confirming fetches of one check: few, so a change costs little time here.
CONFIRM_FETCHES = 2


def shop(state: dict[str, Any]) -> str:
    """The HTML page in a given state."""
    items = "".join(f"<li>{item}</li>" for item in state["stock"])
    banner = '<div id="banner">Winter sale</div>' if state["banner"] else ""
    return (
        "<html><head><title>Shop</title></head><body>"
        f'{banner}<div id="price"><p>Price: {state["price"]} EUR</p></div>'
        f'<ul class="stock">{items}</ul>'
        f'<p class="news">News: {state["news"]}</p>'
        f"<p>Updated: 2026-11-{state['day']:02d}</p>"
        "</body></html>"
    )


def document(state: dict[str, Any]) -> str:
    """The JSON document in a given state."""
    return json.dumps({"price": state["price"], "updated": state["day"], "items": state["stock"]})


#: Who tracks what: (address, path, filters for ViewSpec.build).
VIEWS = [
    ("css@example.org", "/shop", {"selector": "#price"}),
    ("xpath@example.org", "/shop", {"selector": "//ul[@class='stock']"}),
    ("jsonpath@example.org", "/api.json", {"selector": "$.price"}),
    ("include@example.org", "/shop", {"include": ["^Price:"]}),
    ("exclude@example.org", "/shop", {"exclude": ["^Updated:"]}),
    ("ignore@example.org", "/shop", {"ignore": ["UPDATED:", "re:^News"]}),
    ("trigger@example.org", "/shop", {"selector": "ul.stock", "trigger": "sold out"}),
    ("banner@example.org", "/shop", {"selector": "#banner"}),
    # One user, two views of one page: each its own verdicts.
    ("two@example.org", "/shop", {"selector": "#price"}),
    ("two@example.org", "/shop", {"selector": "xpath://p[@class='news']"}),
]
#: The cycles whose changes each user is told about (cycle 0 takes the baselines).
EXPECTED = {
    "css@example.org": [2],
    "xpath@example.org": [3, 4],
    "jsonpath@example.org": [2],
    "include@example.org": [2],
    "exclude@example.org": [2, 3, 4, 5, 6],
    "ignore@example.org": [2, 3, 4, 6],
    "trigger@example.org": [4],
    "banner@example.org": [],
    "two@example.org": [2, 5],
}


def edit(state: dict[str, Any], cycle: int) -> None:
    """What changes before ``cycle``: the date stamp every cycle, and one edit each."""
    state["day"] = cycle + 1
    if cycle == 2:
        state["price"] = 12
    if cycle == 3:
        state["stock"] = [*state["stock"], "Gadget: in stock"]  # no trigger text
    if cycle == 4:
        state["stock"] = ["Widget: sold out", "Gadget: in stock"]
    if cycle == 5:
        state["news"] = "Closed on Monday"
    if cycle == 6:
        state["banner"] = False  # the banner view's selector stops matching


def test_each_view_alerts_on_its_change_and_the_page_is_fetched_once(
    store, agents, settings, site, inbox, db_url
):
    state: dict[str, Any] = {
        "price": 10,
        "stock": ["Widget: in stock"],
        "news": "Open",
        "day": 1,
        "banner": True,
    }
    site.set_page("/shop", shop(state))
    site.set_page("/api.json", document(state), content_type="application/json")
    sessions = sessionmaker(store.engine)
    with sessions.begin() as s:
        for address in dict.fromkeys(a for a, _, _ in VIEWS):
            pages.add_user(s, address, PASSWORD)
        for address, path, filters in VIEWS:
            pages.track(s, address, site.url(path), view=ViewSpec.build(**filters))
    env = agent_env(inbox)
    env["JODL_CONFIRM_FETCHES"] = str(CONFIRM_FETCHES)
    agents(1, env=env)
    app = app_settings()

    told: dict[str, list[int]] = {address: [] for address in EXPECTED}
    shop_fetches = []
    for cycle in range(7):
        edit(state, cycle)
        site.set_page("/shop", shop(state))
        site.set_page("/api.json", document(state), content_type="application/json")
        site.clear_log()
        before = inbox.per_recipient()
        result = run_app_cycle(store, settings, app)
        assert result.errors == 0
        shop_fetches.append(len(site.requests("/shop")))
        after = inbox.per_recipient()
        for address in told:
            if after[address] > before[address]:
                told[address].append(cycle)

    assert told == EXPECTED
    # Nine views of /shop, one check of it per cycle: one fetch, and a change's few
    # confirming fetches are shared by all the views that differ.
    assert shop_fetches[1] == 1  # only the date stamp changed: every view the same
    assert all(1 <= n <= 1 + CONFIRM_FETCHES for n in shop_fetches), shop_fetches

    # What each digest says: the view's filtered lines only.
    (css,) = inbox.to("css@example.org")
    assert "+ Price: 12 EUR" in css.text and "Updated" not in css.text.split("changed")[1]
    (jsonpath,) = inbox.to("jsonpath@example.org")
    assert "+ 12" in jsonpath.text
    (trigger,) = inbox.to("trigger@example.org")
    assert "+ Widget: sold out" in trigger.text
    two = inbox.to("two@example.org")
    assert "+ Price: 12 EUR" in two[0].text and "News" not in two[0].text.split("changed")[1]
    assert (
        "+ News: Closed on Monday" in two[1].text and "Price" not in two[1].text.split("changed")[1]
    )

    with sessions() as s:
        # The trigger's view took the stock change of cycle 3 as its new baseline, quietly.
        trigger_key = ViewSpec.build(selector="ul.stock", trigger="sold out").key
        kinds = list(
            s.scalars(
                select(Snapshot.kind).where(Snapshot.selector == trigger_key).order_by(Snapshot.id)
            )
        )
        assert kinds == ["baseline", "quiet", "change"]
        # The two views of one user: two trackings, two views, each with its own history.
        two_id = s.scalar(select(User.id).where(User.email == "two@example.org"))
        keys = set(s.scalars(select(Tracking.selector).where(Tracking.user_id == two_id)))
        assert keys == {"#price", "xpath://p[@class='news']"}
        for key in keys:
            assert (
                s.scalar(
                    select(func.count()).where(Snapshot.selector == key, Snapshot.kind == "change")
                )
                == 1
            )
        problems = dict(s.execute(select(PageView.selector, PageView.problem)).tuples().all())
    assert problems["#banner"] == "the selector #banner matches nothing on the page"
    assert {k: v for k, v in problems.items() if v} == {"#banner": problems["#banner"]}

    # The tracker sees it: in the API, on the tracked-pages page, in `jodl tracked`.
    web = create_app(
        WebSettings(database_url=db_url, web_secure_cookies=False), engine=store.engine
    )
    client = web.test_client()
    headers = basic("banner@example.org")
    (listed,) = client.get("/api/pages", headers=headers).get_json()["pages"]
    assert listed["problem"] == "the selector #banner matches nothing on the page"
    assert listed["filters"]["selector"] == "#banner"
    browser = web.test_client()
    login(browser, "banner@example.org")
    html = browser.get("/pages").get_data(as_text=True)
    assert "the selector #banner matches nothing on the page" in html
    out = CliRunner().invoke(
        main, ["--database-url", db_url, "tracked", "--user", "banner@example.org"]
    )
    assert "(filter: the selector #banner matches nothing on the page)" in out.output
    # Two views of a page in the API: two trackings, each with its own history.
    listed = client.get("/api/pages", headers=basic("two@example.org")).get_json()["pages"]
    assert len(listed) == 2 and len({p["tracking"] for p in listed}) == 2
    for entry in listed:
        history = client.get(
            f"/api/pages/{entry['id']}?tracking={entry['tracking']}",
            headers=basic("two@example.org"),
        ).get_json()
        assert [s["kind"] for s in history["snapshots"]] == ["change", "baseline"]
        assert history["filters"] == entry["filters"]


def basic(email: str) -> dict[str, str]:
    raw = base64.b64encode(f"{email}:{PASSWORD}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


# -- bad expressions: refused at once, one line naming them -------------------------------------

BAD = [
    (["--selector", "div >"], "invalid CSS selector 'div >'"),
    (["--xpath", "//p["], "invalid XPath expression '//p['"),
    (["--selector", "//p[@"], "invalid XPath expression '//p[@'"),
    (["--jsonpath", "$.a[?"], "invalid JSONPath expression '$.a[?'"),
    (["--include", "(unclosed"], "invalid regular expression in include '(unclosed'"),
    (["--exclude", "a{2,1}"], "invalid regular expression in exclude 'a{2,1}'"),
    (["--ignore", "re:[z-a]"], "invalid regular expression in ignore '[z-a]'"),
    (["--trigger", "re:*x"], "invalid regular expression in trigger '*x'"),
]


@pytest.mark.parametrize(("args", "named"), BAD, ids=[a[0] for a, _ in BAD])
def test_a_bad_expression_is_refused_in_one_line_by_the_cli(store, db_url, args, named):
    with sessionmaker(store.engine).begin() as s:
        pages.add_user(s, "a@example.org")
    out = CliRunner().invoke(
        main,
        [
            "--database-url",
            db_url,
            "track",
            "http://example.org/",
            "--user",
            "a@example.org",
            *args,
        ],
    )
    assert out.exit_code == 1
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], out.output
    with sessionmaker(store.engine)() as s:
        assert s.scalar(select(func.count()).select_from(Tracking)) == 0


API_BAD = [
    ({"selector": "div >"}, "invalid CSS selector 'div >'"),
    ({"xpath": "//p["}, "invalid XPath expression '//p['"),
    ({"selector": "xpath:count("}, "invalid XPath expression 'count('"),
    ({"jsonpath": "$.a[?"}, "invalid JSONPath expression '$.a[?'"),
    ({"include": ["(unclosed"]}, "invalid regular expression in include '(unclosed'"),
    ({"exclude": ["a{2,1}"]}, "invalid regular expression in exclude 'a{2,1}'"),
    ({"ignore": ["re:[z-a]"]}, "invalid regular expression in ignore '[z-a]'"),
    ({"trigger": "re:*x"}, "invalid regular expression in trigger '*x'"),
    ({"include": "not a list", "exclude": [1]}, "exclude: a list of texts"),
    ({"selector": "#a", "xpath": "//a"}, "give one of selector, xpath, jsonpath"),
]


def test_a_bad_expression_is_refused_with_400_by_the_api_and_the_form(store, db_url):
    with sessionmaker(store.engine).begin() as s:
        pages.add_user(s, "a@example.org", PASSWORD)
    web = create_app(
        WebSettings(database_url=db_url, web_secure_cookies=False), engine=store.engine
    )
    client = web.test_client()
    for filters, named in API_BAD:
        r = client.post(
            "/api/pages",
            json={"url": "http://example.org/", **filters},
            headers=basic("a@example.org"),
        )
        assert r.status_code == 400, (filters, r.get_data(as_text=True))
        message = r.get_json()["message"]
        assert named in message and "\n" not in message, (filters, message)
    # A good view is taken, and listed with its filters.
    r = client.post(
        "/api/pages",
        json={
            "url": "http://example.org/",
            "xpath": "//main",
            "include": ["^Price"],
            "ignore": ["updated"],
            "trigger": "re:\\d+ left",
        },
        headers=basic("a@example.org"),
    )
    assert r.status_code == 201, r.get_data(as_text=True)
    assert r.get_json()["filters"] == {
        "selector": "xpath://main",
        "include": ["^Price"],
        "exclude": [],
        "ignore": ["updated"],
        "trigger": "re:\\d+ left",
    }
    # The web form: 400, the message on the page, nothing added.
    browser = web.test_client()
    login(browser, "a@example.org")
    r = browser.post(
        "/pages",
        data={
            "url": "http://example.org/other",
            "selector": "//p[",
            "include": "^Price\n^Stock",
            "csrf_token": token(browser, "/pages"),
        },
    )
    assert r.status_code == 400
    page = r.get_data(as_text=True)
    assert "invalid XPath expression &#39;//p[&#39;" in page
    assert "^Price\n^Stock" in page  # what was typed stays in the form
    with sessionmaker(store.engine)() as s:
        assert s.scalar(select(func.count()).select_from(Tracking)) == 1


# -- what a view's filters keep ------------------------------------------------------------------


def test_selectors_of_each_kind_pick_their_part():
    html = b"<html><body><p>a</p><div><p>b</p><span>c</span></div></body></html>"
    assert extract(html, "text/html", selector="div p").text == "b"
    assert extract(html, "text/html", selector="//p").text == "a\nb"
    assert extract(html, "text/html", selector="(//p)[2]").text == "b"
    assert extract(html, "text/html", selector="xpath:count(//p)").text == "2"
    assert extract(html, "text/html", selector="css:span").text == "c"
    assert extract(html, "text/html", selector="//nothing").selector_matches == 0
    doc = b'{"a": [{"p": 1}, {"p": "x y"}], "b": 2}'
    assert extract(doc, "application/json", selector="$.a[*].p").text == "1\nx y"
    assert extract(doc, "application/json", selector="jsonpath:b").text == "2"
    assert extract(html, "text/html", selector="$.a").selector_matches == 0


def test_line_filters_and_the_trigger():
    text = "Price: 10\nUpdated: today\nNews: open\nStock: 3 left"
    assert ViewSpec.build(include=["^Price", "left$"]).filter_lines(text) == (
        "Price: 10\nStock: 3 left"
    )
    assert ViewSpec.build(exclude=["^Updated"]).filter_lines(text).count("\n") == 2
    assert "Updated" not in ViewSpec.build(ignore=["UPDATED"]).filter_lines(text)
    assert ViewSpec.build(ignore=["re:^N"]).filter_lines(text).count("\n") == 2
    assert ViewSpec.build(trigger="LEFT").triggered(text)
    assert not ViewSpec.build(trigger="sold out").triggered(text)
    assert ViewSpec.build(trigger=r"re:\d+ left").triggered(text)
    assert not ViewSpec.build(trigger=r"re:^\d+ left").triggered(text)


def test_a_view_key_round_trips_and_stays_a_plain_selector_alone():
    assert ViewSpec.build().key == ""
    assert ViewSpec.build(selector="css:#a").key == "#a"  # as selectors were stored
    assert ViewSpec.build(selector="//p").key == "xpath://p"
    spec = ViewSpec.build(selector="$.a", include=["x"], trigger="y")
    assert ViewSpec.parse(spec.key) == spec
    assert ViewSpec.parse("#a") == ViewSpec(selector="#a")
    with pytest.raises(FilterError, match="at most"):
        ViewSpec.build(include=["x" * 200] * 10)


def test_the_cli_tracks_and_untracks_one_view_of_a_page(store, db_url):
    with sessionmaker(store.engine).begin() as s:
        pages.add_user(s, "a@example.org")

    def jodl(*args: str) -> Any:
        return CliRunner().invoke(main, ["--database-url", db_url, *args])

    url = "http://example.org/shop"
    assert jodl("track", url, "--user", "a@example.org").exit_code == 0
    out = jodl("track", url, "--user", "a@example.org", "--xpath", "//ul", "--trigger", "sold out")
    assert out.exit_code == 0, out.output
    assert "(xpath://ul; alert on 'sold out')" in out.output
    again = jodl(
        "track", url, "--user", "a@example.org", "--xpath", "//ul", "--trigger", "sold out"
    )
    assert again.exit_code == 0  # the same view: nothing added
    listing = jodl("tracked", "--user", "a@example.org").output.splitlines()
    assert len(listing) == 2 and "[xpath://ul; alert on 'sold out']" in listing[1]
    gone = jodl("untrack", url, "--user", "a@example.org", "--selector", "//ul")
    assert gone.exit_code == 1  # no such view: the trigger is part of it
    assert "does not track http://example.org/shop through that view" in gone.output
    gone = jodl(
        "untrack", url, "--user", "a@example.org", "--xpath", "//ul", "--trigger", "sold out"
    )
    assert gone.exit_code == 0, gone.output
    with sessionmaker(store.engine)() as s:
        assert list(s.scalars(select(Tracking.selector))) == [""]
    both = jodl("track", url, "--user", "a@example.org", "--selector", "#a", "--jsonpath", "$.a")
    assert both.exit_code == 1
    assert both.output.strip() == "error: give one of --selector, --xpath, --jsonpath"
