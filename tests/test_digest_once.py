"""Each digest reaches the SMTP server at most once, judged by the server (aiosmtpd).

Two agents, and one digest the server is slow to accept: the master would send a
backup copy of that straggler to the idle agent, and a copy on another agent did
send the mail a second time. Then kills: the master at every step of the cycle,
and the agent that is sending, mid-conversation or right after the server took
the mail. The count comes from what the server received, not from the database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from agents import AgentProcess, free_port, run_jodl, wait_for
from aiosmtpd.controller import Controller
from app_support import Inbox, add_users_tracking, agent_env, app_settings
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from test_app_cycle import KILL_CHAIN, digest_payload, html

from crawler_app.checking.cycle import CycleResult, PageCycle
from crawler_app.checking.families import Notify, SmtpRefused
from crawler_app.models import (
    DigestClaim,
    DigestClaimState,
    Notification,
    NotificationState,
    User,
)
from crawler_app.settings import AppSettings
from jodl.exceptions import ConfigError
from jodl.master import Master

pytest_plugins = ("tests.site",)

#: The recipient whose digest the server is slow to accept (seconds).
SLOW = "all@example.org"
SLOW_SECONDS = 2.0
#: Longest the server holds the slow digest for a test that releases it itself.
HOLD_LIMIT = 60.0
RECIPIENTS = ("ann@example.org", "bob@example.org", SLOW)


class SlowInbox(Inbox):
    """Keeps every message; holds the DATA of the slow recipient's digest first.

    For :data:`SLOW_SECONDS`, or, with :attr:`release` set to an event, until the
    test sets it (at most :data:`HOLD_LIMIT`). An SMTP client that goes away
    meanwhile takes the message with it: aiosmtpd drops a DATA it was still handling.
    """

    def __init__(self) -> None:
        super().__init__()
        self.slow_started = threading.Event()
        self.release: threading.Event | None = None

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        if SLOW in envelope.rcpt_tos:
            self.slow_started.set()
            if self.release is None:
                await asyncio.sleep(SLOW_SECONDS)
            else:
                deadline = time.monotonic() + HOLD_LIMIT
                while not self.release.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def slow_inbox() -> Iterator[SlowInbox]:
    handler = SlowInbox()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    handler.port = controller.port
    try:
        yield handler
    finally:
        controller.stop()


def prepare(store: Any, site: Any, settings: Any) -> None:
    """Two pages changed, to be confirmed by the next cycle: three digests to send."""
    for name in ("p", "q"):
        site.set_page(f"/{name}", html(name, "v1"), headers={"ETag": '"1"'})
    add_users_tracking(store, site.url("/p"), ["ann@example.org", SLOW])
    add_users_tracking(store, site.url("/q"), ["bob@example.org", SLOW])
    cycle_in_thread(store, settings).result(timeout=120)
    for name in ("p", "q"):
        site.set_page(f"/{name}", html(name, "v2"), headers={"ETag": '"2"'})


def cycle_in_thread(store: Any, settings: Any) -> Future[CycleResult]:
    future: Future[CycleResult] = Future()

    def run() -> None:
        master = Master(settings, store=store)
        try:
            future.set_result(PageCycle(store.engine, master.run_cycle, app_settings()).run())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            future.set_exception(exc)
        finally:
            master.close()

    threading.Thread(target=run, daemon=True).start()
    return future


def assert_each_digest_once(inbox: Inbox) -> None:
    assert inbox.per_recipient() == {r: 1 for r in RECIPIENTS}, inbox.per_recipient()


def test_a_slow_digest_gets_no_second_copy(store, agents, settings, site, slow_inbox) -> None:
    agents(2, env=agent_env(slow_inbox))
    prepare(store, site, settings)
    result = cycle_in_thread(store, settings).result(timeout=120)
    assert result.sent == 3
    assert_each_digest_once(slow_inbox)


def test_a_master_killed_at_each_step_with_two_agents(
    store, agents, settings, site, slow_inbox, db_url
) -> None:
    agents(2, env=agent_env(slow_inbox))
    prepare(store, site, settings)
    env = {"JODL_DATABASE_URL": db_url, "JODL_MAIL_FROM": "JODL <jodl@example.org>"}
    for point in KILL_CHAIN:
        killed = run_jodl("cycle", env={**env, "JODL_FAILPOINT": point})
        assert killed.returncode == -9, (point, killed.stdout, killed.stderr)
    final = run_jodl("cycle", env=env)
    assert final.returncode == 0, final.stderr
    assert_each_digest_once(slow_inbox)


def claims(store: Any) -> dict[str, tuple[str, str]]:
    """Every digest claim: recipient -> (state, node)."""
    with sessionmaker(store.engine)() as s:
        rows = s.execute(
            select(User.email, DigestClaim.state, DigestClaim.node)
            .join(Notification, Notification.idem_key == DigestClaim.idem_key)
            .join(User, User.id == Notification.user_id)
        ).all()
    return {email: (state, node) for email, state, node in rows}


def slow_sender(store: Any, agents_: list[AgentProcess], *states: str) -> AgentProcess | None:
    """The agent holding the slow digest's claim in one of ``states``, once there is one."""
    state, node = claims(store).get(SLOW, ("", ""))
    if state not in states:
        return None
    port = int(node.rpartition(":")[2])
    return next(a for a in agents_ if a.port == port)


def only_the_slow_digest_in_flight(store: Any, inbox: Inbox) -> bool:
    """The others are accepted by the server and recorded sent: the victim can hold no other."""
    others = [r for r in RECIPIENTS if r != SLOW]
    found = claims(store)
    return all(inbox.to(r) and found.get(r, ("",))[0] == DigestClaimState.SENT for r in others)


@pytest.mark.parametrize("when", ["mid_conversation", "after_accepted"])
def test_the_sending_agent_killed(store, agents, settings, site, slow_inbox, when) -> None:
    started = agents(2, env=agent_env(slow_inbox))
    prepare(store, site, settings)
    # The server holds the slow digest until told: whatever the machine's load, the
    # kill falls where this test says, and the other two digests are done by then.
    slow_inbox.release = threading.Event()
    future = cycle_in_thread(store, settings)
    try:
        assert slow_inbox.slow_started.wait(60), "the slow digest never reached the server"
        victim = wait_for(
            lambda: slow_sender(store, started, DigestClaimState.SENDING), 30, "the slow claim"
        )
        wait_for(
            lambda: only_the_slow_digest_in_flight(store, slow_inbox),
            30,
            "the other digests to be sent",
        )
        if when == "after_accepted":
            slow_inbox.release.set()
            wait_for(lambda: slow_inbox.to(SLOW), 30, "the server to accept the slow digest")
        assert isinstance(victim, AgentProcess)
        victim.kill()
    finally:
        slow_inbox.release.set()
    future.result(timeout=120)
    got = slow_inbox.per_recipient()
    assert (got["ann@example.org"], got["bob@example.org"]) == (1, 1)
    if when == "after_accepted":
        # The server took it; the retry on the other agent found the claim and held back.
        assert got[SLOW] == 1
    else:
        # Cut off before the server answered: it dropped the message. The claim says an
        # attempt may have delivered it, so it is not sent again (at most once) and the
        # digest is recorded failed, saying why.
        assert got[SLOW] == 0
        with sessionmaker(store.engine)() as s:
            note = s.scalar(select(Notification).join(User).where(User.email == SLOW))
            assert note.state == NotificationState.FAILED
            assert "may already have been delivered" in note.error


def test_no_claim_before_the_server_greets(store, db_url, slow_inbox, monkeypatch) -> None:
    # A server that takes the connection and has not greeted yet (a slow greeting).
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    monkeypatch.setenv("JODL_DATABASE_URL", db_url)
    monkeypatch.setenv("JODL_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("JODL_SMTP_PORT", str(listener.getsockname()[1]))
    notify = Notify()
    payload = digest_payload("digest-9-1")
    outcome: Future[Any] = Future()

    def run() -> None:
        try:
            outcome.set_result(notify.run(payload))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    with listener, listener.accept()[0]:
        # Connected, waiting for the greeting: nothing is handed over yet, so an agent
        # killed now must leave no claim that would stop a retry from sending it.
        assert notify.journal.state("digest-9-1") is None
    with pytest.raises(RuntimeError, match="SMTP error"):
        outcome.result(timeout=30)
    assert notify.journal.state("digest-9-1") is None
    notify.settings = dataclasses.replace(notify.settings, smtp_port=slow_inbox.port)
    assert notify.run(payload)["sent"] is True
    assert notify.journal.state("digest-9-1") == DigestClaimState.SENT
    assert slow_inbox.per_recipient() == {"ann@example.org": 1}


def test_smtp_credentials_go_only_over_tls(store, db_url, slow_inbox, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="JODL_SMTP_USER is set but neither"):
        AppSettings.from_env(env={"JODL_SMTP_USER": "ann", "JODL_SMTP_PASSWORD": "secret"})
    monkeypatch.setenv("JODL_DATABASE_URL", db_url)
    monkeypatch.setenv("JODL_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("JODL_SMTP_PORT", str(slow_inbox.port))
    notify = Notify()
    # Settings changed behind the start-up check: the family checks again before sending.
    notify.settings = dataclasses.replace(notify.settings, smtp_user="ann", smtp_password="pw")
    payload = {
        "key": "digest-9-9",
        "message_id": "<digest-9-9.1@example.org>",
        "from": "JODL <jodl@example.org>",
        "to": "ann@example.org",
        "subject": "s",
        "text": "t",
    }
    with pytest.raises(SmtpRefused, match="refusing to send the SMTP password unencrypted"):
        notify.run(payload)
    assert slow_inbox.mails == []
    # With STARTTLS asked of a server that offers none, nothing is sent in clear either.
    notify.settings = dataclasses.replace(notify.settings, smtp_starttls=True)
    with pytest.raises(RuntimeError, match="SMTPNotSupportedError"):
        notify.run(payload)
    assert slow_inbox.mails == []
