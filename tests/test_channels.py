"""Notification channels end to end: a real webhook receiver (Apprise ``json://``) and the
SMTP sink each get exactly one digest per user per cycle, across kills of the master at
every step and of the agent between the claim and the send; the SSRF guard refuses a
private channel target when it is added and when it is sent; ``jodl channels``.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from agents import run_jodl, wait_for
from app_support import add_users_tracking, agent_env, app_settings, inbox, run_app_cycle
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from test_app_cycle import KILL_CHAIN, html
from test_digest_once import cycle_in_thread
from test_web_views import PASSWORD, login

from crawler_app.models import AppCycle, Delivery, Notification, NotificationState, User
from crawler_app.notify import channels
from crawler_app.users.pages import add_user, get_user
from jodl.log.models import ExecState, Execution
from web.app import create_app
from web.settings import WebSettings

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest

LOOPBACK = "127.0.0.0/8"
USERS = ("ann@example.org", "bob@example.org")


class Webhook:
    """A real HTTP server on loopback that keeps every JSON notification it is posted."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"{}")
                with hook.lock:
                    hook.got.append((self.path, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"json://127.0.0.1:{self.port}/hook/{name}-secret-token"

    def per_path(self) -> Counter[str]:
        with self.lock:
            return Counter(path.split("/")[2].split("-")[0] for path, _ in self.got)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    try:
        yield hook
    finally:
        hook.server.shutdown()
        hook.server.server_close()


def add_channel(store: Any, email: str, url: str, allow: tuple[str, ...] = (LOOPBACK,)) -> int:
    with sessionmaker(store.engine, expire_on_commit=False).begin() as s:
        return channels.add_channel(s, get_user(s, email), url, allow).id


def channel_env(inbox: Any, allow: str | None = LOOPBACK) -> dict[str, str]:
    env = agent_env(inbox)
    if allow is not None:
        env["JODL_CHANNEL_ALLOW"] = allow
    return env


def two_users_with_a_change_ahead(store: Any, site: Any, webhook: Webhook) -> None:
    """ann and bob track /p (baseline taken by the first cycle); each has a webhook channel."""
    site.set_page("/p", html("P", "v1"), headers={"ETag": '"1"'})
    add_users_tracking(store, site.url("/p"), list(USERS))
    for email in USERS:
        add_channel(store, email, webhook.url(email.split("@")[0]))


def deliveries(store: Any) -> dict[str, tuple[str, str | None]]:
    """Every channel delivery: user -> (state, error)."""
    with sessionmaker(store.engine)() as s:
        rows = s.execute(
            select(User.email, Delivery.state, Delivery.error)
            .join(Notification, Notification.id == Delivery.notification_id)
            .join(User, User.id == Notification.user_id)
        ).all()
    return {email: (state, error) for email, state, error in rows}


def test_each_channel_and_each_inbox_gets_one_digest_per_cycle(
    store, agents, settings, site, inbox, webhook
):
    two_users_with_a_change_ahead(store, site, webhook)
    agents(1, env=channel_env(inbox))
    assert run_app_cycle(store, settings).notifications == 0  # the baseline
    site.set_page("/p", html("P", "v2 <b>&</b>"), headers={"ETag": '"2"'})
    second = run_app_cycle(store, settings)
    assert (second.changed, second.notifications, second.sent) == (1, 2, 4)
    assert inbox.per_recipient() == {u: 1 for u in USERS}
    assert webhook.per_path() == {"ann": 1, "bob": 1}
    path, body = webhook.got[0]
    assert body["title"] == "JODL: 1 tracked page changed"
    assert site.url("/p") in body["message"] and "+ v2 &" in body["message"]
    assert deliveries(store) == {u: (NotificationState.SENT, None) for u in USERS}
    # A later cycle without changes sends nothing anywhere.
    third = run_app_cycle(store, settings)
    assert third.sent == 0
    assert len(webhook.got) == 2 and len(inbox.mails) == 2


def test_a_master_killed_at_each_step_sends_each_channel_one_digest(
    store, agents, settings, site, inbox, webhook, db_url
):
    two_users_with_a_change_ahead(store, site, webhook)
    agents(1, env=channel_env(inbox))
    run_app_cycle(store, settings)
    site.set_page("/p", html("P", "v2"), headers={"ETag": '"2"'})
    env = {"JODL_DATABASE_URL": db_url, "JODL_MAIL_FROM": "JODL <jodl@example.org>"}
    for point in KILL_CHAIN:
        killed = run_jodl("cycle", env={**env, "JODL_FAILPOINT": point})
        assert killed.returncode == -9, (point, killed.stdout, killed.stderr)
    final = run_jodl("cycle", env=env)
    assert final.returncode == 0, final.stderr
    assert inbox.per_recipient() == {u: 1 for u in USERS}
    assert webhook.per_path() == {"ann": 1, "bob": 1}
    assert deliveries(store) == {u: (NotificationState.SENT, None) for u in USERS}
    assert run_app_cycle(store, settings).sent == 0
    assert len(webhook.got) == 2


def test_an_agent_killed_between_claim_and_send_sends_nothing_twice(
    store, agents, settings, site, inbox, webhook
):
    two_users_with_a_change_ahead(store, site, webhook)
    # The only agent dies right after its first claim (an e-mail's or a channel's),
    # before sending anything; checks never reach that point.
    (doomed,) = agents(1, slots=1, env={**channel_env(inbox), "JODL_FAILPOINT": "notify_claimed"})
    run_app_cycle(store, settings)
    site.set_page("/p", html("P", "v2"), headers={"ETag": '"2"'})
    future = cycle_in_thread(store, settings)
    wait_for(lambda: not doomed.alive(), 120, "the doomed agent to die at its claim")
    agents(1, env=channel_env(inbox))  # the master places the rest, and the retry, here
    future.result(timeout=120)
    got = Counter({f"mail:{k}": v for k, v in inbox.per_recipient().items()})
    got.update({f"hook:{k}": v for k, v in webhook.per_path().items()})
    # The claimed one is not sent again (it may have gone out); the three others once.
    assert len(got) == 3 and all(count == 1 for count in got.values()), got
    with sessionmaker(store.engine)() as s:
        failed = [
            *s.scalars(select(Notification.error).where(Notification.state == "failed")),
            *s.scalars(select(Delivery.error).where(Delivery.state == "failed")),
        ]
    assert len(failed) == 1 and "may already have been delivered" in str(failed[0])


def test_a_private_channel_is_refused_when_added_and_when_sent(
    store, agents, settings, site, inbox, webhook, db_url
):
    site.set_page("/p", html("P", "v1"), headers={"ETag": '"1"'})
    with sessionmaker(store.engine).begin() as s:
        add_user(s, "ann@example.org", PASSWORD)
        add_user(s, "ops@example.org", PASSWORD).is_admin = True
    add_users_tracking(store, site.url("/p"), ["ann@example.org"])
    with pytest.raises(channels.ChannelRefused, match="private or loopback.*JODL_CHANNEL_ALLOW"):
        add_channel(store, "ann@example.org", webhook.url("ann"), allow=())
    # Added where the operator allowed loopback; the agents' operator did not.
    add_channel(store, "ann@example.org", webhook.url("ann"))
    agents(1, env=channel_env(inbox, allow=None))
    run_app_cycle(store, settings)
    site.set_page("/p", html("P", "v2"), headers={"ETag": '"2"'})
    result = run_app_cycle(store, settings)
    assert result.sent == 1  # the e-mail
    assert webhook.got == []
    state, error = deliveries(store)["ann@example.org"]
    assert state == NotificationState.FAILED
    assert "127.0.0.1 is a private or loopback address" in str(error)
    assert "secret-token" not in str(error)  # the URL is masked in errors too
    # The run page's failures list it (the notify run's failed attempt).
    with sessionmaker(store.engine)() as s:
        cycle = s.scalar(select(AppCycle).order_by(AppCycle.id.desc()).limit(1))
        errors = s.scalars(
            select(Execution.error).where(
                Execution.run_id == cycle.notify_run_id, Execution.state != ExecState.DONE
            )
        ).all()
    assert any("private or loopback" in str(e) for e in errors)
    # Shown on the user's pages and on the notify run's page of the web UI.
    web = create_app(
        WebSettings(database_url=db_url, web_secure_cookies=False), engine=store.engine
    )
    user, ops = web.test_client(), web.test_client()
    login(user, "ann@example.org")
    login(ops, "ops@example.org")
    notice = user.get("/pages").get_data(as_text=True)
    assert "did not reach you" in notice and "private or loopback" in notice
    run_page = ops.get(f"/admin/runs/{cycle.notify_run_id}").get_data(as_text=True)
    assert "private or loopback" in run_page and "secret-token" not in run_page


def test_channels_commands(store, db_url, webhook) -> None:
    env = {"JODL_DATABASE_URL": db_url}
    assert run_jodl("users", "add", "ann@example.org", env=env).returncode == 0
    url = webhook.url("ann")
    refused = run_jodl("channels", "add", "ann@example.org", url, env=env)
    assert refused.returncode != 0
    (line,) = [x for x in refused.stderr.splitlines() if x.strip()]
    assert "127.0.0.1 is a private or loopback address" in line
    assert "JODL_CHANNEL_ALLOW" in line and "secret-token" not in line
    allowed = {**env, "JODL_CHANNEL_ALLOW": LOOPBACK}
    added = run_jodl("channels", "add", "ann@example.org", url, env=allowed)
    assert added.returncode == 0, added.stderr
    assert "channel 1 json://127.0.0.1" in added.stdout and "secret-token" not in added.stdout
    bad = run_jodl("channels", "add", "ann@example.org", "nosuch://x", env=allowed)
    assert bad.returncode != 0 and "not an Apprise URL" in bad.stderr
    listed = run_jodl("channels", "list", "ann@example.org", env=env)
    assert listed.returncode == 0
    assert listed.stdout.startswith("1\tjson://127.0.0.1") and "secret-token" not in listed.stdout
    tested = run_jodl("channels", "test", "ann@example.org", "1", env=allowed)
    assert tested.returncode == 0, tested.stderr
    assert len(webhook.got) == 1 and webhook.got[0][1]["title"] == channels.TEST_TITLE
    # Without the allowlist the test is refused too, before anything is sent.
    assert run_jodl("channels", "test", "ann@example.org", "1", env=env).returncode != 0
    assert len(webhook.got) == 1
    removed = run_jodl("channels", "remove", "ann@example.org", "1", env=env)
    assert removed.returncode == 0 and "removed" in removed.stdout
    gone = run_jodl("channels", "remove", "ann@example.org", "1", env=env)
    assert gone.returncode != 0 and "no channel 1" in gone.stderr


def test_masked_urls_hide_tokens() -> None:
    shown = channels.open_channel("slack://T1ABCDEF/B2ABCDEF/C3ABCDEFGHIJ").shown()
    assert "ABCDEF" not in shown
    shown = channels.open_channel("mailto://ann:hunter2secret@example.org").shown()
    assert "hunter2" not in shown
    shown = channels.open_channel("json://example.org/hook/abcdefghijkl?token=zzzzzz").shown()
    assert "abcdefghijkl" not in shown and "zzzzzz" not in shown
    with pytest.raises(channels.ChannelError, match="delivers on the server itself"):
        channels.open_channel("syslog://")
    assert app_settings(channel_allow=(LOOPBACK,)).channel_allow == (LOOPBACK,)
