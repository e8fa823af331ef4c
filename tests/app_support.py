"""Shared parts of the page checker's end-to-end tests: a real SMTP inbox and agent settings.

The inbox is an aiosmtpd server on a free loopback port that keeps every message
it accepts. Agents for the page checker get the allowlist for 127.0.0.0/8 (so the
tests' local site is reachable; everything else private stays refused), no
per-host spacing, a short delay before a confirming fetch, and the inbox as
their SMTP server.
"""

from __future__ import annotations

import email
import email.policy
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from agents import free_port
from aiosmtpd.controller import Controller
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from crawler_app.checking.cycle import CycleResult, PageCycle
from crawler_app.models import User
from crawler_app.settings import AppSettings
from crawler_app.users import pages
from jodl.master import Master


@dataclass(frozen=True)
class Mail:
    """One message as the SMTP server received it."""

    envelope_to: tuple[str, ...]
    to: str
    message_id: str
    subject: str
    text: str
    html: str


class Inbox:
    """aiosmtpd handler that keeps what it receives."""

    def __init__(self) -> None:
        self.mails: list[Mail] = []
        self._lock = threading.Lock()
        self.port = 0

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        text = html = ""
        for part in msg.walk():
            if part.get_content_type() == "text/plain":
                text = part.get_content()
            elif part.get_content_type() == "text/html":
                html = part.get_content()
        mail = Mail(
            tuple(envelope.rcpt_tos),
            str(msg["To"]),
            str(msg["Message-ID"]),
            str(msg["Subject"]),
            text,
            html,
        )
        with self._lock:
            self.mails.append(mail)
        return "250 Message accepted for delivery"

    def to(self, address: str) -> list[Mail]:
        with self._lock:
            return [m for m in self.mails if address in m.envelope_to]

    def per_recipient(self) -> Counter[str]:
        with self._lock:
            return Counter(r for m in self.mails for r in m.envelope_to)

    def distinct_ids(self, address: str) -> int:
        return len({m.message_id for m in self.to(address)})

    def wait_count(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.mails) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {count} mails, got {len(self.mails)}")
            time.sleep(0.01)


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    """A real SMTP server on 127.0.0.1 that keeps every message."""
    handler = Inbox()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    handler.port = controller.port
    try:
        yield handler
    finally:
        controller.stop()


def agent_env(inbox: Inbox | None = None, allow: str | None = "127.0.0.0/8") -> dict[str, str]:
    """Environment of a page-checker agent for the tests."""
    env = {
        "JODL_FETCH_HOST_INTERVAL": "0",
        "JODL_FETCH_HOST_IN_FLIGHT": "8",
        "JODL_FETCH_CONNECT_TIMEOUT": "5",
        "JODL_FETCH_TOTAL_TIMEOUT": "10",
        # A difference is confirmed by fetching again within the check: soon, in tests.
        "JODL_CONFIRM_DELAY": "0.05",
    }
    if allow is not None:
        env["JODL_FETCH_ALLOW"] = allow
    if inbox is not None:
        env["JODL_SMTP_HOST"] = "127.0.0.1"
        env["JODL_SMTP_PORT"] = str(inbox.port)
    return env


def app_settings(**overrides: object) -> AppSettings:
    """Master-side settings independent of the developer's environment."""
    values: dict[str, object] = {
        "mail_from": "JODL <jodl@example.org>",
        "check_spread": 0.0,
        # Every tracker's pages may use the agents' allowlist (the local site is on loopback).
        "fetch_allow_users": ("*",),
    }
    values.update(overrides)
    return AppSettings.from_env(env={}, **values)


def run_app_cycle(store, settings, app: AppSettings | None = None, **kwargs) -> CycleResult:
    """One application cycle in this process, on a fresh master."""
    master = Master(settings, store=store)
    try:
        return PageCycle(store.engine, master.run_cycle, app or app_settings()).run(**kwargs)
    finally:
        master.close()


def add_users_tracking(store, url: str, emails: list[str], selector: str | None = None) -> None:
    """Create the users that do not exist yet and let each track ``url``."""
    sessions = sessionmaker(store.engine)
    with sessions() as s, s.begin():
        for address in emails:
            if s.scalar(select(User.id).where(User.email == address)) is None:
                pages.add_user(s, address)
            pages.track(s, address, url, selector=selector)
