"""The page checker's job families, run on the agents: ``check_page`` and ``notify``.

``check_page`` fetches one page (async, many in flight per agent, one fetcher per
agent so connections, per-host politeness and robots.txt are shared) and
returns its status, validators and the fingerprint of each *view* the page's
trackers asked for (whole page, selectors and line filters,
:mod:`crawler_app.fetching.filters`): however many views, the page is fetched once. A
view's text travels back only when its fingerprint is not one the master
already knows, so an unchanged page costs a few hundred bytes.

``notify`` sends one digest e-mail over SMTP, or one digest to one of the user's
notification channels (:mod:`crawler_app.notify.channels`, through Apprise). Once connected
and greeted (for a channel: once its target passed the SSRF guard), it claims the
digest's idempotency key in the shared database *before* handing the message over
and marks it sent as soon as it was accepted, so a digest run twice, on any agents
(a master restart, a retry elsewhere after a lost answer), goes out at most once.
"""

from __future__ import annotations

import asyncio
import email.utils
import smtplib
import ssl
import threading
import time
from dataclasses import replace
from email.message import EmailMessage
from typing import Any

from jodl import Family, Permanent, failpoint
from jodl.log import make_engine
from jodl.settings.config import Settings

from ..fetching.browser import Renderer
from ..fetching.fetcher import THREAD_PARSE_BYTES, Fetcher
from ..fetching.filters import FilterError, ViewSpec
from ..fetching.pagekind import built_by_script, error_page
from ..fetching.reach import Reach
from ..fetching.text import SelectorError, extract, fingerprint
from ..metrics import FETCHES, NOTIFICATIONS
from ..models import DigestClaimState
from ..notify.channels import ChannelError, open_channel
from ..notify.claims import Journal
from ..settings import SMTP_IN_CLEAR, AppSettings
from .check_result import CheckResult, ViewResult
from .confirm import BASELINE_DELAY, BASELINE_FETCHES, Known, ViewCheck
from .variance import Model

#: Longest wait before a spread check starts (guards against a clock far off).
MAX_START_DELAY = 3600.0


def _view(text: str, matches: int | None, limit: int, fp: str | None = None) -> ViewResult:
    truncated = len(text) > limit
    if truncated:
        text = text[:limit].rstrip()
    if fp is None or truncated:
        # ``text`` comes from extract(), already normalised, unless it was cut here.
        fp = fingerprint(text, normalised=not truncated)
    return ViewResult(fp, len(text), matches, text, truncated)


def _selector_texts(
    body: bytes, content_type: str | None, keys: list[str], whole: str
) -> dict[str, tuple[str, int | None] | str]:
    """Each view's filtered text and selector match count, or its error message.

    ``keys``: view keys (:attr:`~crawler_app.fetching.filters.ViewSpec.key`); ``whole``: the
    whole page's text, the start of a view that filters lines only. The body is
    parsed once per selector, not once per view."""
    if not content_type:
        content_type = "text/html" if body.lstrip()[:1] == b"<" else "text/plain"
    found: dict[str, tuple[str, int | None] | str] = {}
    picked: dict[str, tuple[str, int | None] | str] = {}
    for key in keys:
        try:
            spec = ViewSpec.parse(key)
        except FilterError as exc:
            found[key] = str(exc)
            continue
        if spec.selector is None:
            text, matches = whole, None
        else:
            if spec.selector not in picked:
                try:
                    page = extract(body, content_type, selector=spec.selector)
                    picked[spec.selector] = (page.text, page.selector_matches)
                except SelectorError as exc:
                    picked[spec.selector] = str(exc)
            value = picked[spec.selector]
            if isinstance(value, str):
                found[key] = value
                continue
            text, matches = value
        found[key] = (spec.filter_lines(text), matches)
    return found


class CheckPage(Family):
    """Fetch one page with its stored validators; judge each requested view.

    Payload: ``url``; ``etag`` and ``last_modified`` as the server sent them last;
    ``views``: ``{view key: {"known": [fingerprints], "model": {...}}}`` (``""`` is
    the whole page, :mod:`crawler_app.fetching.filters`; see :mod:`crawler_app.checking.confirm`);
    ``start_at``: Unix time before which the fetch does not start (spread). A view
    that differs from its baseline has the page fetched again
    (``JODL_CONFIRM_DELAY``, ``JODL_CONFIRM_FETCHES``).
    Result: a :class:`~crawler_app.checking.check_result.CheckResult` as JSON, the fetcher's
    status fields of the last fetch, ``fetches``, and each view's fingerprint and
    verdict (its text only for a new baseline or a change). Fetch errors, and a 200
    page that reads as an error page (``error_page``), are results (``ok`` false), not
    failures;
    ``script_page`` says the page builds its text with scripts. With ``browser``
    true in the payload the page is rendered (:mod:`crawler_app.fetching.browser`) and the
    result's ``browser`` counts the requests it made and those refused. ``reach``
    (:class:`~crawler_app.fetching.reach.Reach`, written where the job is queued): only
    ``"allowlist"`` lets the fetches reach the networks of ``JODL_FETCH_ALLOW``.
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
        self._renderer: Renderer | None = None

    async def run(self, payload: dict[str, Any]) -> Any:
        url = str(payload["url"])
        start_at = payload.get("start_at")
        if start_at:
            delay = min(float(start_at) - time.time(), MAX_START_DELAY)
            if delay > 0:
                await asyncio.sleep(delay)
        if self._fetcher is None:
            self._fetcher = Fetcher(self.fetch_settings)
        wanted = {
            sel: Known.from_payload(v) for sel, v in (payload.get("views") or {"": []}).items()
        }
        checks = {
            sel: ViewCheck(known, self.settings.confirm_fetches) for sel, known in wanted.items()
        }
        browser = bool(payload.get("browser"))
        # Who asked decides, as the master or web wrote it: never the page's URL.
        allowlist = Reach.of_payload(payload) is Reach.ALLOWLIST
        out = await self._fetch(
            url, payload.get("etag"), payload.get("last_modified"), checks, browser, allowlist
        )
        if not out.ok or out.not_modified:
            return out.to_json()
        fetches = 1
        views = dict(out.views or {})
        # Fetched again, unconditionally, while a view differs from its baseline.
        while not all(c.settled for c in checks.values()) and fetches <= max(
            self.settings.confirm_fetches, BASELINE_FETCHES
        ):
            # A new view's baseline fetches follow one another (they learn what varies
            # per request); a difference is confirmed after the delay.
            baselines = all(c.baseline for c in checks.values() if not c.settled)
            await asyncio.sleep(BASELINE_DELAY if baselines else self.settings.confirm_delay)
            fetches += 1
            again = await self._fetch(url, None, None, checks, browser, allowlist)
            if again.ok and not again.not_modified:
                views.update(again.views or {})
        for check in checks.values():
            check.finish()
        judged = {sel: checks[sel].result(view) for sel, view in views.items()}
        return replace(out, views=judged, fetches=fetches).to_json()

    async def _fetch(
        self,
        url: str,
        etag: str | None,
        last_modified: str | None,
        checks: dict[str, ViewCheck],
        browser: bool = False,
        allowlist: bool = False,
    ) -> CheckResult:
        """One fetch (a rendering with ``browser``); each view's text goes to its check
        (an error page counts as an error). ``allowlist``: the job may reach the
        networks of ``JODL_FETCH_ALLOW`` (:mod:`crawler_app.fetching.reach`)."""
        assert self._fetcher is not None
        if browser:
            if self._renderer is None:
                self._renderer = Renderer(self._fetcher, self.settings.browser_settings())
            result, body = await self._renderer.render(url, use_allowlist=allowlist)
        else:
            result, body = await self._fetcher.fetch_with_body(
                url, etag=etag, last_modified=last_modified, use_allowlist=allowlist
            )
        out = CheckResult.of_fetch(result, rendered=browser)
        count_fetch(out)
        if not out.ok or out.not_modified:
            return out
        limit = self.fetch_settings.max_text_chars
        texts: dict[str, tuple[str, int | None, str | None]] = {}
        if "" in checks:
            # The fetcher fingerprinted the same (already cut) text.
            texts[""] = (result.get("text") or "", None, result.get("fingerprint"))
        others = [sel for sel in checks if sel]
        views: dict[str, ViewResult] = {}
        whole = result.get("text") or ""
        if others and body is not None:
            if len(body) > THREAD_PARSE_BYTES:
                found = await asyncio.to_thread(
                    _selector_texts, body, out.content_type, others, whole
                )
            else:
                found = _selector_texts(body, out.content_type, others, whole)
            for sel, value in found.items():
                if isinstance(value, str):
                    views[sel] = ViewResult(error=value)
                else:
                    texts[sel] = (value[0], value[1], None)
        model = checks[""].known.model if "" in checks else Model()
        # A rendered page ran its scripts: its text is what they built, however short.
        out = replace(out, script_page=not browser and built_by_script(body, whole))
        why = error_page(out.title, whole, model)
        if why is not None:
            return replace(out, ok=False, error="error_page", error_message=why)
        for sel, (text, matches, fp) in texts.items():
            view = _view(text, matches, limit, fp)
            if view.text:  # no text left is no state of the view (the user is told)
                checks[sel].add(view.text, view.fingerprint or "")
            views[sel] = view
        return replace(out, views=views)


def count_fetch(out: CheckResult) -> None:
    """One fetch in the agent's metrics, by outcome."""
    if out.not_modified:
        outcome = "not_modified"
    elif out.ok:
        outcome = "ok"
    else:
        outcome = str(out.error or "http_error")[:40]
    FETCHES.labels(outcome).inc()


# -- notify -----------------------------------------------------------------------------------


class SmtpRefused(Permanent):
    """SMTP settings ``notify`` will not use (one line saying what to set)."""


def check_smtp_tls(settings: AppSettings) -> None:
    """Credentials go only over TLS: a username needs STARTTLS or implicit TLS."""
    if settings.smtp_user and not (settings.smtp_starttls or settings.smtp_ssl):
        raise SmtpRefused(SMTP_IN_CLEAR)


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
    """Send one digest over SMTP, at most once per idempotency key in the whole cluster.

    Payload: ``key`` (idempotency key), ``message_id``, ``from``, ``to``,
    ``subject``, ``text``, ``html``. Result: ``{"sent": true, "message_id": ...}``,
    or ``{"sent": false, "duplicate": true}`` for a key already sent. The claim is
    taken in the shared database (``JODL_DATABASE_URL``, see
    :class:`~crawler_app.notify.claims.Journal`); SMTP settings come from the agent's
    environment (``JODL_SMTP_*``).

    A channel's delivery has ``key``, ``channel_id``, ``title`` and ``body`` instead;
    its URL is read from the database when it is sent, its target checked by the
    SSRF guard (``JODL_CHANNEL_ALLOW``) before the claim, and the same claim guards it.

    Not idempotent: a second run could mail twice if the claim were bypassed, so
    the master runs no backup copy of it and does not time a running one out.
    """

    name = "notify"
    version = "1"
    idempotent = False

    def __init__(self, context: dict[str, Any] | None = None) -> None:
        super().__init__(context)
        self.settings = AppSettings.from_env()
        self._journal: Journal | None = None
        self._journal_lock = threading.Lock()

    @property
    def journal(self) -> Journal:
        with self._journal_lock:
            if self._journal is None:  # on first use: an agent may start before the database
                self._journal = Journal(make_engine(Settings.from_env().database_url))
            return self._journal

    def run(self, payload: dict[str, Any]) -> Any:
        if "channel_id" in payload:
            return self._to_channel(payload)
        key = str(payload["key"])
        message_id = str(payload["message_id"])
        check_smtp_tls(self.settings)
        msg = build_message(payload)
        try:
            smtp = self._connect()
        except (smtplib.SMTPException, OSError) as exc:
            # Nothing claimed yet: a retry may send it.
            raise RuntimeError(f"SMTP error: {type(exc).__name__}: {exc}") from None
        with smtp:
            # Claimed only now, connected and greeted: an attempt stopped before this
            # point (connecting, a slow greeting, TLS, login) leaves no claim behind, so
            # its retry sends the digest instead of dropping one that never went out.
            found = self.journal.claim(key, message_id, str(self.context.get("node", "")))
            if found == DigestClaimState.SENT:
                NOTIFICATIONS.labels("duplicate").inc()
                return {"sent": False, "duplicate": True, "message_id": message_id}
            if found is not None:
                # Claimed and never confirmed: an attempt stopped mid-conversation (the
                # server may have the mail), or another copy is sending it right now.
                raise Permanent(
                    f"digest {key} may already have been delivered (an earlier attempt was "
                    "interrupted during the SMTP conversation); not sent again"
                )
            failpoint.hit("notify_claimed")  # claimed, nothing sent: crash tests stop here
            try:
                refused = smtp.send_message(msg)
            except smtplib.SMTPRecipientsRefused as exc:
                self.journal.release(key)
                raise Permanent(f"the SMTP server refused {payload['to']}: {exc}") from None
            except (smtplib.SMTPException, OSError) as exc:
                # Nothing was accepted: free the key so a retry may send it.
                self.journal.release(key)
                raise RuntimeError(f"SMTP error: {type(exc).__name__}: {exc}") from None
            # Recorded before QUIT: a failed QUIT must not free the key of an accepted mail.
            self.journal.sent(key)
        NOTIFICATIONS.labels("sent").inc()
        return {
            "sent": True,
            "message_id": message_id,
            "to": payload["to"],
            "refused": {str(k): str(v) for k, v in refused.items()},
        }

    def _to_channel(self, payload: dict[str, Any]) -> Any:
        """One digest to one notification channel, claimed like an e-mail."""
        key = str(payload["key"])
        url = self.journal.channel_url(int(payload["channel_id"]))
        if url is None:
            raise Permanent(f"digest {key}: the channel was removed before it was sent")
        try:
            channel = open_channel(url)
            # Checked here, on the agent that sends, as well as when it was added: the
            # operator's allowlist and the name's DNS answer may have changed since.
            channel.check(self.settings.channel_allow)
        except ChannelError as exc:
            raise Permanent(str(exc)) from None
        found = self.journal.claim(key, key, str(self.context.get("node", "")))
        if found == DigestClaimState.SENT:
            NOTIFICATIONS.labels("duplicate").inc()
            return {"sent": False, "duplicate": True, "channel": channel.shown()}
        if found is not None:
            raise Permanent(
                f"digest {key} may already have been delivered to {channel.shown()} (an "
                "earlier attempt was interrupted while sending); not sent again"
            )
        failpoint.hit("notify_claimed")  # claimed, nothing sent: crash tests stop here
        try:
            channel.send(str(payload["title"]), str(payload["body"]))
        except ChannelError as exc:
            # The service took nothing (an error answer, no connection): a retry may send.
            self.journal.release(key)
            raise RuntimeError(str(exc)) from None
        self.journal.sent(key)
        NOTIFICATIONS.labels("sent").inc()
        return {"sent": True, "channel": channel.shown()}

    def _connect(self) -> smtplib.SMTP:
        """A connection to the SMTP server, greeted, over TLS as configured, logged in."""
        s = self.settings
        context = ssl.create_default_context()  # smtplib's own does not check certificates
        smtp: smtplib.SMTP
        if s.smtp_ssl:
            smtp = smtplib.SMTP_SSL(
                s.smtp_host, s.smtp_port, timeout=s.smtp_timeout, context=context
            )
        else:
            smtp = smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=s.smtp_timeout)
        try:
            smtp.ehlo_or_helo_if_needed()
            if s.smtp_starttls and not s.smtp_ssl:
                smtp.starttls(context=context)
                smtp.ehlo()
            if s.smtp_user:
                smtp.login(s.smtp_user, s.smtp_password or "")
        except BaseException:
            smtp.close()
            raise
        return smtp
