"""The page checker's job families, run on the agents: ``check_page`` and ``notify``.

``check_page`` fetches one page (async, many in flight per agent, one fetcher per
agent so connections, per-host politeness and robots.txt are shared) and
returns its status, validators and the fingerprint of each *view* the page's
trackers asked for (whole page, CSS selectors). A view's text travels back only
when its fingerprint is not one the master already knows, so an unchanged page
costs a few hundred bytes.

``notify`` sends one digest e-mail over SMTP. It writes the digest's
idempotency key to its journal *before* talking to the SMTP server and marks it
sent right after, so a digest handed to an agent twice (a master restart, a
retry elsewhere after a lost answer) is recognised and not sent again.
"""

from __future__ import annotations

import asyncio
import email.utils
import smtplib
import sqlite3
import ssl
import threading
import time
from email.message import EmailMessage
from typing import Any

from jodl.family import Family, Permanent
from jodl.metrics import FETCHES, NOTIFICATIONS

from .fetcher import THREAD_PARSE_BYTES, Fetcher
from .settings import AppSettings
from .text import SelectorError, extract, fingerprint

#: Longest wait before a spread check starts (guards against a clock far off).
MAX_START_DELAY = 3600.0

# Result keys copied from the fetcher's result.
_COPIED = (
    "url", "final_url", "status", "ok", "not_modified", "etag", "last_modified",
    "content_type", "size", "title", "truncated", "elapsed", "error", "error_reason",
    "error_message",
)  # fmt: skip


def _view(
    text: str, matches: int | None, known: list[str], limit: int, fp: str | None = None
) -> dict[str, Any]:
    truncated = len(text) > limit
    if truncated:
        text = text[:limit].rstrip()
    if fp is None or truncated:
        # ``text`` comes from extract(), already normalised, unless it was cut here.
        fp = fingerprint(text, normalised=not truncated)
    out: dict[str, Any] = {"fingerprint": fp, "chars": len(text), "matches": matches}
    if truncated:
        out["truncated"] = True
    if fp not in known:
        out["text"] = text
    return out


def _selector_views(
    body: bytes, content_type: str | None, wanted: dict[str, list[str]], limit: int
) -> dict[str, dict[str, Any]]:
    if not content_type:
        content_type = "text/html" if body.lstrip()[:1] == b"<" else "text/plain"
    views: dict[str, dict[str, Any]] = {}
    for selector, known in wanted.items():
        try:
            page = extract(body, content_type, selector=selector)
        except SelectorError as exc:
            views[selector] = {"error": str(exc)}
            continue
        views[selector] = _view(page.text, page.selector_matches, known, limit)
    return views


class CheckPage(Family):
    """Fetch one page with its stored validators; fingerprint each requested view.

    Payload: ``url``; ``etag`` and ``last_modified`` as the server sent them last;
    ``views``: ``{selector: [known fingerprints]}`` (``""`` is the whole page);
    ``start_at``: Unix time before which the fetch does not start (spread).
    Result: the fetcher's status fields plus ``views``: ``{selector: {fingerprint,
    chars, matches, text?}}`` (``text`` only for an unknown fingerprint). Fetch
    errors are results (``ok`` false, ``error`` code and message), not failures.
    """

    name = "check_page"
    version = "1"
    idempotent = True

    def __init__(self, context: dict[str, Any] | None = None) -> None:
        super().__init__(context)
        self.settings = AppSettings.from_env()
        self.fetch_settings = self.settings.fetch_settings()
        # Made on first use, inside the agent's event loop (its locks belong to that loop).
        self._fetcher: Fetcher | None = None

    async def run(self, payload: dict[str, Any]) -> Any:
        url = str(payload["url"])
        start_at = payload.get("start_at")
        if start_at:
            delay = min(float(start_at) - time.time(), MAX_START_DELAY)
            if delay > 0:
                await asyncio.sleep(delay)
        if self._fetcher is None:
            self._fetcher = Fetcher(self.fetch_settings)
        wanted: dict[str, list[str]] = dict(payload.get("views") or {"": []})
        result, body = await self._fetcher.fetch_with_body(
            url, etag=payload.get("etag"), last_modified=payload.get("last_modified")
        )
        out = {key: result.get(key) for key in _COPIED}
        out["redirects"] = len(result.get("redirects") or ())
        count_fetch(out)
        if not result.get("ok") or result.get("not_modified"):
            return out
        limit = self.fetch_settings.max_text_chars
        views: dict[str, dict[str, Any]] = {}
        if "" in wanted:
            text = result.get("text") or ""
            # The fetcher fingerprinted the same (already cut) text.
            views[""] = _view(text, None, wanted[""], limit, result.get("fingerprint"))
        others = {sel: known for sel, known in wanted.items() if sel}
        if others and body is not None:
            if len(body) > THREAD_PARSE_BYTES:
                views.update(
                    await asyncio.to_thread(
                        _selector_views, body, result.get("content_type"), others, limit
                    )
                )
            else:
                views.update(_selector_views(body, result.get("content_type"), others, limit))
        out["views"] = views
        return out


def count_fetch(out: dict[str, Any]) -> None:
    """One fetch in the agent's metrics, by outcome."""
    if out.get("not_modified"):
        outcome = "not_modified"
    elif out.get("ok"):
        outcome = "ok"
    else:
        outcome = str(out.get("error") or "http_error")[:40]
    FETCHES.labels(outcome).inc()


# -- notify -----------------------------------------------------------------------------------


class Journal:
    """Which digests this agent started and finished sending, by idempotency key.

    In memory, or in a SQLite file (``JODL_MAIL_JOURNAL``) so it outlives the agent.
    One lock per key: two copies of one digest never talk to the SMTP server at once.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._memory: dict[str, str] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        if path:
            with self._connect() as conn:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS digest (key TEXT PRIMARY KEY, state TEXT, "
                    "message_id TEXT, at REAL)"
                )

    def _connect(self) -> sqlite3.Connection:
        assert self.path
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def state(self, key: str) -> str | None:
        """``sending``, ``sent`` or None (never started here)."""
        if not self.path:
            return self._memory.get(key)
        with self._connect() as conn:
            row = conn.execute("SELECT state FROM digest WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def mark(self, key: str, state: str | None, message_id: str = "") -> None:
        """Record ``state`` for ``key`` durably (None forgets it: nothing went out)."""
        if not self.path:
            if state is None:
                self._memory.pop(key, None)
            else:
                self._memory[key] = state
            return
        with self._connect() as conn:
            if state is None:
                conn.execute("DELETE FROM digest WHERE key = ?", (key,))
            else:
                conn.execute(
                    "INSERT INTO digest (key, state, message_id, at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET state = excluded.state, at = excluded.at",
                    (key, state, message_id, time.time()),
                )


def build_message(payload: dict[str, Any]) -> EmailMessage:
    """The digest as an e-mail (plain text, and HTML as the alternative)."""
    msg = EmailMessage()
    msg["From"] = payload["from"]
    msg["To"] = payload["to"]
    msg["Subject"] = payload["subject"]
    msg["Date"] = email.utils.formatdate(localtime=True)
    msg["Message-ID"] = payload["message_id"]
    msg["Auto-Submitted"] = "auto-generated"
    msg["X-JODL-Digest"] = payload["key"]
    msg.set_content(payload["text"])
    if payload.get("html"):
        msg.add_alternative(payload["html"], subtype="html")
    return msg


class Notify(Family):
    """Send one digest over SMTP, at most once per idempotency key on this agent.

    Payload: ``key`` (idempotency key), ``message_id``, ``from``, ``to``,
    ``subject``, ``text``, ``html``. Result: ``{"sent": true, "message_id": ...}``,
    or ``{"sent": false, "duplicate": true}`` for a key this agent already sent.
    SMTP settings come from the agent's environment (``JODL_SMTP_*``).
    """

    name = "notify"
    version = "1"
    idempotent = True

    def __init__(self, context: dict[str, Any] | None = None) -> None:
        super().__init__(context)
        self.settings = AppSettings.from_env()
        self.journal = Journal(self.settings.mail_journal)

    def run(self, payload: dict[str, Any]) -> Any:
        key = str(payload["key"])
        message_id = str(payload["message_id"])
        with self.journal.lock(key):
            state = self.journal.state(key)
            if state == "sent":
                NOTIFICATIONS.labels("duplicate").inc()
                return {"sent": False, "duplicate": True, "message_id": message_id}
            if state == "sending":
                # An earlier attempt here stopped mid-conversation: the server may have
                # the mail. Sending again could make a duplicate; a human must decide.
                raise Permanent(
                    f"digest {key} may already have been delivered (an earlier attempt on "
                    "this agent was interrupted); not sent again"
                )
            msg = build_message(payload)
            self.journal.mark(key, "sending", message_id)  # record before send
            try:
                refused = self._send(msg)
            except smtplib.SMTPRecipientsRefused as exc:
                self.journal.mark(key, None)
                raise Permanent(f"the SMTP server refused {payload['to']}: {exc}") from None
            except (smtplib.SMTPException, OSError) as exc:
                # Nothing was accepted: forget the key so a retry may send it.
                self.journal.mark(key, None)
                raise RuntimeError(f"SMTP error: {type(exc).__name__}: {exc}") from None
            self.journal.mark(key, "sent", message_id)  # record after send
            NOTIFICATIONS.labels("sent").inc()
        return {"sent": True, "message_id": message_id, "to": payload["to"], "refused": refused}

    def _send(self, msg: EmailMessage) -> dict[str, Any]:
        s = self.settings
        with smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=s.smtp_timeout) as smtp:
            if s.smtp_starttls:
                # smtplib's own default context does not check the certificate.
                smtp.starttls(context=ssl.create_default_context())
            if s.smtp_user:
                smtp.login(s.smtp_user, s.smtp_password or "")
            refused = smtp.send_message(msg)
        return {str(k): str(v) for k, v in refused.items()}
