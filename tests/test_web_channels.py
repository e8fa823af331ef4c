"""Notification channels in the web UI and the JSON API (Flask test client, CSRF on):
add (refused private targets, one line), masked lists, "Send a test" to a real webhook
receiver, remove; failed digests shown on the user's pages."""

from __future__ import annotations

import pytest
import test_web_views
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker
from test_channels import LOOPBACK, Webhook, webhook
from test_web_views import PASSWORD, assert_safe, text_of, token

from crawler_app.models import AppCycle, Delivery, Notification, NotificationState
from crawler_app.users.pages import get_user

app = test_web_views.app
user_client = test_web_views.user_client
__all__ = ["webhook"]  # the fixture, imported for pytest


@pytest.fixture
def allow_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JODL_CHANNEL_ALLOW", LOOPBACK)


def add(client: FlaskClient, url: str) -> tuple[int, str]:
    r = client.post(
        "/notifications/channels",
        data={"url": url, "csrf_token": token(client, "/notifications")},
        follow_redirects=True,
    )
    return r.status_code, r.get_data(as_text=True)


def test_a_private_target_is_refused_in_one_line(user_client: FlaskClient, webhook: Webhook):
    code, html = add(user_client, webhook.url("ann"))
    assert code == 400
    doc = assert_safe(html)
    (flash,) = doc.xpath("//p[contains(@class, 'flash')]")
    message = text_of(flash)
    assert "127.0.0.1 is a private or loopback address" in message
    assert "JODL_CHANNEL_ALLOW" in message and "secret-token" not in message
    assert "\n" not in message.strip()
    assert doc.xpath("//table[@id='channels']") == []


def test_add_test_and_remove_a_channel(
    user_client: FlaskClient, webhook: Webhook, allow_loopback: None
) -> None:
    url = webhook.url("ann")
    # Every form needs the session's CSRF token.
    assert user_client.post("/notifications/channels", data={"url": url}).status_code == 403
    code, html = add(user_client, url)
    assert code == 200
    doc = assert_safe(html)
    (row,) = doc.xpath("//table[@id='channels']/tbody/tr")
    shown = text_of(row)
    assert f"json://127.0.0.1:{webhook.port}/hook/" in shown
    assert "secret-token" not in html  # nowhere on the page, masked in the list
    (test_form,) = row.xpath(".//form[contains(@action, '/test')]")
    r = user_client.post(
        test_form.get("action"),
        data={"csrf_token": token(user_client, "/notifications")},
        follow_redirects=True,
    )
    assert "test sent to json://127.0.0.1" in r.get_data(as_text=True)
    assert len(webhook.got) == 1 and webhook.got[0][0] == "/hook/ann-secret-token"
    code, html = add(user_client, url)
    assert code == 400 and "has this channel already" in html
    (remove_form,) = row.xpath(".//form[contains(@action, '/remove')]")
    r = user_client.post(
        remove_form.get("action"), data={"csrf_token": token(user_client, "/notifications")}
    )
    assert r.status_code == 303
    doc = assert_safe(user_client.get("/notifications").get_data(as_text=True))
    assert doc.xpath("//table[@id='channels']") == []


def test_a_failed_test_says_why(user_client: FlaskClient, allow_loopback: None) -> None:
    code, _ = add(user_client, "json://127.0.0.1:9/closed-port")
    assert code == 200
    csrf = token(user_client, "/notifications")
    r = user_client.post("/notifications/channels/1/test", data={"csrf_token": csrf})
    page = user_client.get(r.headers["Location"]).get_data(as_text=True)
    assert "Connection error" in page
    # Someone else's channel (or none) is not found.
    assert (
        user_client.post("/notifications/channels/2/test", data={"csrf_token": csrf}).status_code
        == 404
    )


def test_the_api_manages_channels(app: Flask, webhook: Webhook, allow_loopback: None) -> None:
    client = app.test_client()
    test_web_views.make_user(app, "api@example.org")
    r = client.post("/api/session", json={"email": "api@example.org", "password": PASSWORD})
    assert r.status_code == 200
    csrf = {"X-CSRF-Token": client.get("/api/session").get_json()["csrf_token"]}
    assert client.post("/api/channels", json={"url": webhook.url("a")}).status_code == 403
    r = client.post("/api/channels", json={"url": webhook.url("a")}, headers=csrf)
    assert r.status_code == 201, r.get_json()
    added = r.get_json()
    assert "secret-token" not in added["url"]
    r = client.post("/api/channels", json={"url": "nosuch://x"}, headers=csrf)
    assert r.status_code == 400 and "not an Apprise URL" in r.get_json()["message"]
    listed = client.get("/api/channels").get_json()["channels"]
    assert listed == [added]
    r = client.post(f"/api/channels/{added['id']}/test", json={}, headers=csrf)
    assert r.get_json()["ok"] is True and len(webhook.got) == 1
    assert client.delete(f"/api/channels/{added['id']}", headers=csrf).status_code == 204
    assert client.delete(f"/api/channels/{added['id']}", headers=csrf).status_code == 404
    assert client.get("/api/channels").get_json()["channels"] == []
    assert client.get("/api/notifications").get_json() == {"digests": []}
    assert app.test_client().get("/api/channels").status_code == 401


def test_a_failed_delivery_shows_on_the_users_pages(
    app: Flask, user_client: FlaskClient, allow_loopback: None
) -> None:
    add(user_client, "json://127.0.0.1:9/hook")
    with sessionmaker(app.extensions["jodl"].engine).begin() as s:
        user = get_user(s, "user@example.org")
        cycle = AppCycle()
        s.add(cycle)
        s.flush()
        note = Notification(
            cycle_id=cycle.id,
            user_id=user.id,
            idem_key=f"digest-{cycle.id}-{user.id}",
            message_id="<m@example.org>",
            state=NotificationState.SENT,
            snapshots=[],
        )
        s.add(note)
        s.flush()
        s.add(
            Delivery(
                notification_id=note.id,
                channel_id=1,
                idem_key=f"{note.idem_key}-c1",
                state=NotificationState.FAILED,
                error="channel json://127.0.0.1:9/hook: <b>refused</b>",
            )
        )
    pages = assert_safe(user_client.get("/pages").get_data(as_text=True))
    (notice,) = pages.xpath("//p[@id='digest-failure']")
    assert "<b>refused</b>" in text_of(notice)  # escaped, shown as text
    doc = assert_safe(user_client.get("/notifications").get_data(as_text=True))
    (row,) = doc.xpath("//table[@id='digests']/tbody/tr")
    assert "failed" in text_of(row) and "<b>refused</b>" in text_of(row)
    digests = user_client.get("/api/notifications").get_json()["digests"]
    assert digests[0]["channels"][0]["state"] == "failed"
