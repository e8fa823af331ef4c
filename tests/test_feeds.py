"""The Atom feed of a user's changes, read back with feedparser: its entries are the
detected changes, text is escaped, and a rotated token makes the old URL 404."""

from __future__ import annotations

import datetime as dt
from urllib.parse import parse_qs, urlsplit

import feedparser
import test_web_views
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker
from test_web_views import PASSWORD, assert_safe, token

from crawler_app.models import Page, Snapshot, compress
from crawler_app.users.pages import track

app = test_web_views.app
user_client = test_web_views.user_client

HOSTILE = '<script>alert(1)</script> & ]]> "news"'


def snapshot(s, page_id: int, kind: str, text: str, when: dt.datetime, selector: str = "") -> int:
    snap = Snapshot(
        page_id=page_id,
        selector=selector,
        kind=kind,
        fingerprint=str(abs(hash(text))),
        text_z=compress(text),
        taken_at=when,
    )
    s.add(snap)
    s.flush()
    return snap.id


def changes(app: Flask, email: str) -> dict[str, int]:
    """Two tracked pages; one changed twice, one once; an untracked view changed too."""
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
    with sessionmaker(app.extensions["jodl"].engine).begin() as s:
        a = track(s, email, "http://a.example/news?x=1&y=2").page_id
        b = track(s, email, "http://b.example/").page_id
        page = s.get(Page, a)
        assert page is not None
        page.title = HOSTILE
        ids = {
            "a0": snapshot(s, a, "baseline", "one", now + dt.timedelta(seconds=1)),
            "a1": snapshot(s, a, "change", "two", now + dt.timedelta(seconds=2)),
            "b0": snapshot(s, b, "baseline", "x", now + dt.timedelta(seconds=3)),
            "other": snapshot(s, b, "change", "y", now + dt.timedelta(seconds=4), "#nav"),
            "a2": snapshot(s, a, "change", "three", now + dt.timedelta(seconds=5)),
            "b1": snapshot(s, b, "change", "z", now + dt.timedelta(seconds=6)),
        }
        ids["a"], ids["b"] = a, b
        return ids


def feed_path(client: FlaskClient) -> str:
    url = client.get("/api/feed").get_json()["url"]
    return urlsplit(url).path


def test_the_feed_lists_the_users_changes(app: Flask, user_client: FlaskClient) -> None:
    ids = changes(app, "user@example.org")
    path = feed_path(user_client)
    assert path == feed_path(user_client)  # the same token until rotated
    # No login needed: the token is the key.
    r = app.test_client().get(path)
    assert r.status_code == 200 and r.mimetype == "application/atom+xml"
    parsed = feedparser.parse(r.data)
    assert not parsed.bozo, parsed.bozo_exception
    entries = parsed.entries
    # Newest first; the baselines and the view the user does not track are left out.
    assert [e.id.rsplit(":", 1)[1] for e in entries] == [str(ids[k]) for k in ("b1", "a2", "a1")]
    a2 = entries[1]
    assert a2.title == f"Changed: {HOSTILE}"  # escaped in the XML, read back as it was
    assert "http://a.example/news?x=1&y=2" in a2.summary
    links = {link.rel: link.href for link in a2.links}
    assert links["related"] == "http://a.example/news?x=1&y=2"
    diff = urlsplit(links["alternate"])
    assert diff.path == f"/pages/{ids['a']}"
    assert parse_qs(diff.query) == {"a": [str(ids["a1"])], "b": [str(ids["a2"])]}
    # Each entry's time is its change's: 6, 5 and 2 seconds after the first snapshot.
    times = [dt.datetime(*e.updated_parsed[:6]) for e in entries]
    assert [(times[0] - t).total_seconds() for t in times] == [0, 1, 4]
    # The diff the entry links to is the user's page comparing those two snapshots.
    page = assert_safe(user_client.get(f"{diff.path}?{diff.query}").get_data(as_text=True))
    assert "three" in page.text_content()


def test_a_wrong_or_rotated_token_is_a_404(app: Flask, user_client: FlaskClient) -> None:
    changes(app, "user@example.org")
    old = feed_path(user_client)
    anyone = app.test_client()
    user_id, secret = old.split("/")[2], old.split("/")[3]
    assert anyone.get(old.replace(secret, "x" * len(secret))).status_code == 404
    assert anyone.get(old.replace(f"/{user_id}/", "/999/")).status_code == 404
    # Another user's token does not open this user's feed.
    test_web_views.make_user(app, "eve@example.org")
    eve = app.test_client()
    eve.post("/api/session", json={"email": "eve@example.org", "password": PASSWORD})
    eve_secret = feed_path(eve).split("/")[3]
    assert anyone.get(old.replace(secret, eve_secret)).status_code == 404
    # Rotated with the UI's button (CSRF like every form): the old URL is gone.
    assert user_client.post("/notifications/feed/rotate").status_code == 403
    r = user_client.post(
        "/notifications/feed/rotate", data={"csrf_token": token(user_client, "/notifications")}
    )
    assert r.status_code == 303
    new = feed_path(user_client)
    assert new != old
    assert anyone.get(old).status_code == 404
    assert anyone.get(new).status_code == 200
    # And with the API.
    csrf = {"X-CSRF-Token": user_client.get("/api/session").get_json()["csrf_token"]}
    rotated = user_client.post("/api/feed/rotate", json={}, headers=csrf).get_json()["url"]
    assert anyone.get(new).status_code == 404
    assert anyone.get(urlsplit(rotated).path).status_code == 200


def test_the_feed_is_linked_from_the_notifications_page(user_client: FlaskClient) -> None:
    doc = assert_safe(user_client.get("/notifications").get_data(as_text=True))
    (link,) = doc.xpath("//a[@id='feed-url']")
    assert urlsplit(link.get("href")).path == feed_path(user_client)
    assert feedparser.parse(user_client.get(feed_path(user_client)).data).entries == []


def test_a_tag_has_its_own_feed_under_the_same_token(app: Flask, user_client: FlaskClient) -> None:
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
    with sessionmaker(app.extensions["jodl"].engine).begin() as s:
        shop = track(s, "user@example.org", "http://shop.example/", tags=["prices"]).page_id
        news = track(s, "user@example.org", "http://news.example/", tags=["daily"]).page_id
        # The same page through a second view, tagged otherwise: its changes are not priced.
        track(s, "user@example.org", "http://shop.example/", selector="#nav", tags=["daily"])
        ids = {
            "shop0": snapshot(s, shop, "baseline", "1 EUR", now + dt.timedelta(seconds=1)),
            "shop1": snapshot(s, shop, "change", "2 EUR", now + dt.timedelta(seconds=2)),
            "nav": snapshot(s, shop, "change", "menu", now + dt.timedelta(seconds=3), "#nav"),
            "news1": snapshot(s, news, "change", "later", now + dt.timedelta(seconds=4)),
            "shop2": snapshot(s, shop, "change", "3 EUR", now + dt.timedelta(seconds=5)),
        }
    # Linked from the tracked pages, beside each tag; the API lists them too.
    doc = assert_safe(user_client.get("/pages").get_data(as_text=True))
    links = {a.get("href") for a in doc.xpath("//a[@class='tag-feed']")}
    tags = user_client.get("/api/feed").get_json()["tags"]
    assert set(tags) == {"prices", "daily"}
    assert links == set(tags.values())
    prices = urlsplit(tags["prices"]).path
    secret = urlsplit(user_client.get("/api/feed").get_json()["url"]).path.split("/")[3]
    assert prices == f"/feeds/{prices.split('/')[2]}/{secret}/tags/prices.atom"

    def entries(path: str) -> list[str]:
        r = app.test_client().get(path)  # no login: the token is the key
        assert r.status_code == 200 and r.mimetype == "application/atom+xml"
        parsed = feedparser.parse(r.data)
        assert not parsed.bozo, parsed.bozo_exception
        assert "tagged" in parsed.feed.title
        return [e.id.rsplit(":", 1)[1] for e in parsed.entries]

    assert entries(prices) == [str(ids["shop2"]), str(ids["shop1"])]
    assert entries(urlsplit(tags["daily"]).path) == [str(ids["news1"]), str(ids["nav"])]
    # A tag nobody uses is an empty feed; a malformed one is no feed at all.
    assert entries(prices.replace("prices", "nothing")) == []
    assert app.test_client().get(prices.replace("prices", "no%20way")).status_code == 404
    # Rotating the token ends the tag feeds' URLs with the main one.
    r = user_client.post(
        "/notifications/feed/rotate", data={"csrf_token": token(user_client, "/notifications")}
    )
    assert r.status_code == 303
    assert app.test_client().get(prices).status_code == 404
    new = urlsplit(user_client.get("/api/feed").get_json()["tags"]["prices"]).path
    assert new != prices
    assert entries(new) == [str(ids["shop2"]), str(ids["shop1"])]
