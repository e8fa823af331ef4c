"""Tags per tracking and the search of tracked pages: pages, CLI, API, web page."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_web_views
from agents import run_jodl
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker
from test_web_api import USER, make_app
from test_web_views import assert_safe, token

from crawler_app.models import Page
from crawler_app.users import pages

app = test_web_views.app
user_client = test_web_views.user_client


def test_tags_are_checked_and_normalised():
    given = [" Work ", "prices", "work", "a.b-c_d"]
    assert pages.check_tags(given) == ["work", "prices", "a.b-c_d"]
    for bad in (["two words"], [""], ["x" * 41], ["semi;colon"], ["café"], [5]):
        with pytest.raises(pages.PageError, match="letters, digits"):
            pages.check_tags(bad)  # type: ignore[arg-type]
    with pytest.raises(pages.PageError, match="at most 10 tags"):
        pages.check_tags([f"t{i}" for i in range(11)])
    assert pages.matches("shop PRICE", "http://shop.example/", None, ["prices"])
    assert not pages.matches("shop news", "http://shop.example/", "Shop", ["prices"])


def test_cli_track_with_tags(store, db_url):
    env = {"JODL_DATABASE_URL": db_url}
    assert run_jodl("users", "add", "carol@example.org", env=env).returncode == 0
    url = "http://example.org/x"
    done = run_jodl("track", url, "--user", "carol@example.org", "--tag", "Work", "--tag", "prices",
                    env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tagged work, prices" in done.stdout
    assert "tags: work, prices" in run_jodl("tracked", env=env).stdout
    bad = run_jodl("track", url, "--user", "carol@example.org", "--tag", "no way", env=env)
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("error: tag 'no way': ASCII letters, digits")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_api_tags_and_search(tmp_path: Path) -> None:
    application = make_app(tmp_path)
    client = application.test_client()
    try:
        for url, tags in (
            ("http://shop.example/", ["Prices", "work"]),
            ("http://news.example/", ["daily"]),
        ):
            r = client.post("/api/pages", json={"url": url, "tags": tags}, headers=USER)
            assert r.status_code == 201, r.get_json()
        with sessionmaker(application.extensions["jodl"].engine).begin() as s:
            page = s.query(Page).filter_by(url="http://news.example/").one()
            page.title = "Morning Headlines"
            news_id = page.id

        def found(q: str) -> list[str]:
            r = client.get("/api/pages", query_string={"q": q}, headers=USER)
            assert r.status_code == 200
            return [p["url"] for p in r.get_json()["pages"]]

        assert found("prices") == ["http://shop.example/"]  # a tag, any case
        assert found("headlines") == ["http://news.example/"]  # the title
        assert found("example") == ["http://news.example/", "http://shop.example/"]  # URL
        assert found("shop daily") == []  # every word must match
        assert found("") == ["http://news.example/", "http://shop.example/"]
        (shop,) = [p for p in client.get("/api/pages", headers=USER).get_json()["pages"]
                   if p["url"] == "http://shop.example/"]  # fmt: skip
        assert shop["tags"] == ["prices", "work"]
        r = client.patch(f"/api/pages/{news_id}", json={"tags": ["evening"]}, headers=USER)
        assert r.status_code == 200 and r.get_json()["tags"] == ["evening"]
        assert found("evening") == ["http://news.example/"]
        for body in ({"tags": "a b"}, {"tags": ["no way"]}, {"tags": ["ok"], "paused": "x"}):
            r = client.patch(f"/api/pages/{news_id}", json=body, headers=USER)
            assert r.status_code == 400
        assert found("evening") == ["http://news.example/"]  # refused bodies change nothing
        r = client.patch(f"/api/pages/{news_id}", json={"name": "Daily news"}, headers=USER)
        assert r.status_code == 200 and r.get_json()["name"] == "Daily news"
        assert found("daily") == ["http://news.example/"]  # the tracking's name
        (news,) = [p for p in client.get("/api/pages", headers=USER).get_json()["pages"]
                   if p["url"] == "http://news.example/"]  # fmt: skip
        assert news["name"] == "Daily news" and news["title"] == "Morning Headlines"
        for body in ({"name": 7}, {"name": "x" * 201}):
            assert client.patch(f"/api/pages/{news_id}", json=body, headers=USER).status_code == 400
        r = client.post("/api/pages", json={"url": "http://b.example/", "tags": ["a b"]},
                        headers=USER)  # fmt: skip
        assert r.status_code == 400 and r.get_json()["message"].startswith("tags:")
        assert client.get("/api/pages?q=" + "x" * 201, headers=USER).status_code == 400
    finally:
        application.extensions["jodl"].engine.dispose()


def test_tags_and_search_on_the_tracked_pages(app: Flask, user_client: FlaskClient) -> None:
    csrf = token(user_client, "/pages")
    for url, tags in (("http://shop.example/", "prices, work"), ("http://news.example/", "")):
        r = user_client.post("/pages", data={"url": url, "tags": tags, "csrf_token": csrf})
        assert r.status_code == 303, r.get_data(as_text=True)
    r = user_client.post(
        "/pages", data={"url": "http://c.example/", "tags": "bad;tag", "csrf_token": csrf}
    )
    assert r.status_code == 400 and "letters, digits" in r.get_data(as_text=True)
    doc = assert_safe(user_client.get("/pages").get_data(as_text=True))
    assert len(doc.xpath("//table[@id='tracked']/tbody/tr")) == 2
    assert doc.xpath("//a[@class='tag']/text()") == ["prices", "work"]
    (search,) = doc.xpath("//form[contains(@class, 'search')]")
    assert search.get("method") == "get" and search.xpath(".//input[@name='q']")
    doc = assert_safe(user_client.get("/pages?q=PRICES").get_data(as_text=True))
    rows = doc.xpath("//table[@id='tracked']/tbody/tr")
    assert len(rows) == 1 and "http://shop.example/" in rows[0].text_content()
    assert doc.xpath("string(//input[@name='q']/@value)") == "PRICES"
    doc = assert_safe(user_client.get("/pages?q=nothing-here").get_data(as_text=True))
    assert doc.xpath("//p[@id='no-match']") and not doc.xpath("//table[@id='tracked']")
