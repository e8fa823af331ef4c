"""Tables of the page checker (docs/architecture.md#the-applications), on the library's metadata.

Users track pages; a page is fetched once per cycle however many users track it
(its :class:`Page` is linked 1 : 0..1 to a JODL job of family ``check_page``
keyed by the normalised URL). A page is seen through one or more *views*: the
whole page, and each set of filters some tracking asks for (a selector, line
filters, a trigger: :mod:`crawler_app.fetching.filters`; the ``selector`` columns hold the
view's key). Every view keeps the
state the confirmed-change rule needs (:mod:`crawler_app.checking.change`) and a history
of snapshots for diffs. An application cycle (:class:`AppCycle`) records the
step it is at, so a killed process resumes there; a digest e-mail is one
:class:`Notification` row per user per cycle, unique by its idempotency key.
"""

from __future__ import annotations

import datetime as dt
import zlib
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from jodl.log import Base, BigId, utcnow

#: Longest normalised URL kept (the guard refuses longer ones anyway).
URL_LENGTH = 2048
#: Longest view key stored (a selector, or a view's filters as JSON: crawler_app.fetching.filters).
SELECTOR_LENGTH = 1000
#: The view of the whole page (no selector).
WHOLE_PAGE = ""
#: Longest name of a tracking.
NAME_LENGTH = 200


def compress(text: str | None) -> bytes | None:
    """Normalised text as stored in snapshots (zlib, UTF-8)."""
    return None if text is None else zlib.compress(text.encode("utf-8"), 6)


def decompress(data: bytes | None) -> str | None:
    """The text :func:`compress` stored."""
    return None if data is None else zlib.decompress(data).decode("utf-8")


class User(Base):
    """Someone who tracks pages and receives digests."""

    __tablename__ = "app_user"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    password_hash: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: Operators (admin role) see and manage nodes, runs and the queue in the web UI.
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: Digests go only to confirmed addresses: users an operator adds are; a web sign-up
    #: is once its owner followed the link mailed to it.
    email_confirmed: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    #: Raised by logout and password changes: web sessions of an older version end.
    session_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The secret in the URL of the user's Atom feed (:mod:`crawler_app.notify.feeds`); None
    #: until the feed is first asked for; a new one (rotation) ends the old URL.
    feed_token: Mapped[str | None] = mapped_column(String(64), unique=True)


class UserQuota(Base):
    """An operator's quotas for one user (:mod:`crawler_app.users.quota`); NULL keeps the
    default."""

    __tablename__ = "app_user_quota"
    user_id: Mapped[int] = mapped_column(
        ForeignKey("app_user.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    trackings: Mapped[int | None] = mapped_column(Integer)
    urls_per_day: Mapped[int | None] = mapped_column(Integer)
    batch: Mapped[int | None] = mapped_column(Integer)


class Page(Base):
    """A URL checked once per cycle for all its trackers."""

    __tablename__ = "app_page"
    id: Mapped[int] = mapped_column(primary_key=True)
    url: Mapped[str] = mapped_column(String(URL_LENGTH), unique=True)
    #: The ``check_page`` job that fetches it (None while nobody tracks the page).
    job_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("jodl_job.id", ondelete="SET NULL"), unique=True
    )
    #: Validators exactly as the server sent them (sent back in conditional GETs).
    etag: Mapped[str | None] = mapped_column(String(1024))
    last_modified: Mapped[str | None] = mapped_column(String(255))
    #: Fingerprint of the whole page's text as last fetched.
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    title: Mapped[str | None] = mapped_column(String(300))
    #: The last full fetch had scripts and almost no visible text (crawler_app.fetching.pagekind).
    script_page: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: Rendered in a browser (Chromium) because one of its trackers asked for it; all its
    #: views are then read from the rendered page (crawler_app.fetching.browser).
    browser: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: Requests the page made that the last rendering refused (SSRF guard, limits).
    refused_requests: Mapped[int | None] = mapped_column(Integer)
    #: HTTP status of the last fetch (None: no answer).
    last_status: Mapped[int | None] = mapped_column(Integer)
    #: ``code: message`` of the last failed fetch; None after a good one.
    last_error: Mapped[str | None] = mapped_column(Text)
    last_checked_at: Mapped[dt.datetime | None]
    last_changed_at: Mapped[dt.datetime | None]
    #: Checked every N-th application cycle (1 = every cycle).
    period: Mapped[int] = mapped_column(Integer, default=1)
    #: Start (on the scheduler's tick grid) of the cycle that last checked the page: its
    #: trackings' next due times count from it (crawler_app.checking.due).
    slot_at: Mapped[dt.datetime | None]
    #: The application cycle whose check result was applied last (analysis is idempotent).
    analysed_cycle_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Tracking(Base):
    """User U tracks page P since T through a view (its filters); a user may track one
    page through several views."""

    __tablename__ = "app_tracking"
    __table_args__ = (
        UniqueConstraint("user_id", "page_id", "selector", name="uq_app_tracking_user_page_view"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("app_user.id", ondelete="CASCADE"))
    page_id: Mapped[int] = mapped_column(ForeignKey("app_page.id", ondelete="CASCADE"), index=True)
    #: The view's key (:attr:`crawler_app.fetching.filters.ViewSpec.key`); empty: the whole page.
    selector: Mapped[str | None] = mapped_column(String(SELECTOR_LENGTH), default=WHOLE_PAGE)
    since: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: The tracker wants the page rendered in a browser (it builds its text with scripts).
    browser: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: Paused by its user: keeps its history, asks for no check and gets no digest; a
    #: page whose trackings are all paused is not fetched (crawler_app.users.pages.sync_jobs).
    paused: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: The user's labels for it (:func:`crawler_app.users.pages.check_tags`), searched with the
    #: page's URL and title.
    tags: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    #: Check the page every this many seconds, or on this cron expression (five fields,
    #: local time); neither: on the operator's ``JODL_SCHEDULE`` (crawler_app.checking.due).
    every: Mapped[int | None] = mapped_column(Integer)
    cron: Mapped[str | None] = mapped_column(String(100))
    #: What the user calls it (NULL: the page's title); kept through imports and exports.
    name: Mapped[str | None] = mapped_column(String(NAME_LENGTH))


class PageView(Base):
    """A page seen through one view's filters: its current text and what varies on it."""

    __tablename__ = "app_page_view"
    __table_args__ = (
        UniqueConstraint("page_id", "selector", name="uq_app_page_view_page_selector"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    page_id: Mapped[int] = mapped_column(ForeignKey("app_page.id", ondelete="CASCADE"))
    #: The view's key (:attr:`crawler_app.fetching.filters.ViewSpec.key`); empty for the whole page.
    selector: Mapped[str] = mapped_column(String(SELECTOR_LENGTH), default=WHOLE_PAGE)
    #: Fingerprint of the current (confirmed) text; None before the first good fetch.
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    #: Exact fingerprints of fetches judged the same as the current text, newest first.
    recent: Mapped[list[str]] = mapped_column(JSON, default=list)
    #: What is learned of the view: its baseline's line keys and what varies on it
    #: (:class:`crawler_app.checking.variance.Model`); None before the first baseline.
    model: Mapped[dict[str, str] | None] = mapped_column(JSON)
    last_changed_at: Mapped[dt.datetime | None]
    #: Why the last good fetch gave this view no text (its selector matches nothing,
    #: its filters leave no line, an expression fails on the page); None when it gave some.
    problem: Mapped[str | None] = mapped_column(Text)


class Snapshot(Base):
    """A confirmed state of a view: its text (compressed), for history and diffs."""

    __tablename__ = "app_snapshot"
    __table_args__ = (
        Index("ix_app_snapshot_view", "page_id", "selector", "id"),
        Index("ix_app_snapshot_cycle", "cycle_id"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    page_id: Mapped[int] = mapped_column(ForeignKey("app_page.id", ondelete="CASCADE"))
    selector: Mapped[str] = mapped_column(String(SELECTOR_LENGTH), default=WHOLE_PAGE)
    cycle_id: Mapped[int | None] = mapped_column(ForeignKey("app_cycle.id", ondelete="SET NULL"))
    taken_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: HTTP status of the fetch that confirmed it (304 when confirmed by a 304).
    status: Mapped[int | None] = mapped_column(Integer)
    #: ``baseline`` (first state seen), ``change`` (a confirmed change, notified) or
    #: ``quiet`` (a confirmed change without the view's trigger: the new baseline, untold).
    kind: Mapped[str] = mapped_column(String(16))
    fingerprint: Mapped[str] = mapped_column(String(64))
    text_z: Mapped[bytes | None] = mapped_column(LargeBinary)
    chars: Mapped[int] = mapped_column(Integer, default=0)

    @property
    def text(self) -> str:
        return decompress(self.text_z) or ""


class CycleStep:
    """Steps of the page checker's cycle, in order (see :mod:`crawler_app.checking.cycle`)."""

    PREPARE = "prepare"
    CHECK = "check"
    ANALYSE = "analyse"
    PREPARE_NOTIFICATIONS = "prepare_notifications"
    SEND = "send"
    FINISH = "finish"
    DONE = "done"
    ORDER = (PREPARE, CHECK, ANALYSE, PREPARE_NOTIFICATIONS, SEND, FINISH, DONE)


class AppCycle(Base):
    """One application cycle and the step it has reached (resumed there after a crash)."""

    __tablename__ = "app_cycle"
    id: Mapped[int] = mapped_column(primary_key=True)
    step: Mapped[str] = mapped_column(String(32), default=CycleStep.PREPARE)
    #: True while unfinished, NULL after: the unique index allows one open cycle at most.
    is_open: Mapped[bool | None] = mapped_column(Boolean, unique=True, default=True)
    #: Why the cycle was started (``schedule``, ``command``, ...).
    trigger: Mapped[str] = mapped_column(String(32), default="command")
    #: Checks of this cycle start spread over this many seconds (0: all at once).
    spread: Mapped[float] = mapped_column(default=0.0)
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    step_started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None]
    check_run_id: Mapped[int | None] = mapped_column(ForeignKey("jodl_run.id", ondelete="SET NULL"))
    notify_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("jodl_run.id", ondelete="SET NULL")
    )
    pages: Mapped[int] = mapped_column(Integer, default=0)
    checked: Mapped[int] = mapped_column(Integer, default=0)
    not_modified: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    changed: Mapped[int] = mapped_column(Integer, default=0)
    notifications: Mapped[int] = mapped_column(Integer, default=0)
    sent: Mapped[int] = mapped_column(Integer, default=0)
    #: Per step: seconds it took.
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CycleRequest(Base):
    """An operator asked for an application cycle now (the web UI or API).

    A master's scheduler claims untaken requests (sets ``taken_at`` in the
    transaction that finds them) and runs one cycle for all it took.
    """

    __tablename__ = "app_cycle_request"
    __table_args__ = (Index("ix_app_cycle_request_taken", "taken_at"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("app_user.id", ondelete="SET NULL"))
    requested_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: When a master claimed it (None: pending).
    taken_at: Mapped[dt.datetime | None]
    #: The name of the master that claimed it.
    taken_by: Mapped[str | None] = mapped_column(String(255))
    #: The application cycle run for it (None while it runs, or when nothing was tracked).
    cycle_id: Mapped[int | None] = mapped_column(ForeignKey("app_cycle.id", ondelete="SET NULL"))


class NotificationState:
    PREPARED = "prepared"  # committed with its job; not sent yet
    SENT = "sent"  # the agent reported the SMTP server accepted it
    FAILED = "failed"  # sending failed every attempt


class Notification(Base):
    """One digest e-mail: one user, one cycle, one idempotency key."""

    __tablename__ = "app_notification"
    __table_args__ = (
        UniqueConstraint("cycle_id", "user_id", name="uq_app_notification_cycle_user"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    cycle_id: Mapped[int] = mapped_column(ForeignKey("app_cycle.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("app_user.id", ondelete="CASCADE"))
    #: ``digest-<cycle>-<user>``: the ``notify`` job's key; the Message-ID is built from it.
    idem_key: Mapped[str] = mapped_column(String(100), unique=True)
    message_id: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), default=NotificationState.PREPARED)
    job_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("jodl_job.id", ondelete="SET NULL")
    )
    #: Snapshot ids of the changes the digest lists.
    snapshots: Mapped[list[int]] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    sent_at: Mapped[dt.datetime | None]
    error: Mapped[str | None] = mapped_column(Text)


class DigestClaimState:
    SENDING = "sending"  # claimed: an agent is talking to the SMTP server, or died doing so
    SENT = "sent"  # the SMTP server accepted it


class DigestClaim(Base):
    """The claim on a digest's idempotency key, taken before it is sent (``notify``).

    In the shared database, so every agent sees it, across agent restarts and
    ``jodl up``: a key is sent by whoever inserts its row first, and never again.
    """

    __tablename__ = "app_digest_claim"
    idem_key: Mapped[str] = mapped_column(String(100), primary_key=True)
    message_id: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), default=DigestClaimState.SENDING)
    #: The agent that took the claim.
    node: Mapped[str] = mapped_column(String(255))
    claimed_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    sent_at: Mapped[dt.datetime | None]


class UserChannel(Base):
    """A notification channel of a user (:mod:`crawler_app.notify.channels`): an Apprise URL.

    The URL holds the channel's secrets (tokens, passwords); it is read by the agent
    that sends to it and never shown back in full (:func:`crawler_app.notify.channels.masked`).
    """

    __tablename__ = "app_channel"
    __table_args__ = (UniqueConstraint("user_id", "url", name="uq_app_channel_user_url"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("app_user.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(String(URL_LENGTH))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Delivery(Base):
    """A digest sent to one of its user's channels: one more delivery of a
    :class:`Notification`, with its own idempotency key, ``notify`` job and state
    (:class:`NotificationState`)."""

    __tablename__ = "app_delivery"
    id: Mapped[int] = mapped_column(primary_key=True)
    notification_id: Mapped[int] = mapped_column(
        ForeignKey("app_notification.id", ondelete="CASCADE"), index=True
    )
    #: The channel (None once its user removed it; the row stays as history).
    channel_id: Mapped[int | None] = mapped_column(
        ForeignKey("app_channel.id", ondelete="SET NULL")
    )
    #: ``digest-<cycle>-<user>-c<channel>``: the ``notify`` job's key and the claim's.
    idem_key: Mapped[str] = mapped_column(String(100), unique=True)
    state: Mapped[str] = mapped_column(String(16), default=NotificationState.PREPARED)
    job_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("jodl_job.id", ondelete="SET NULL")
    )
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    sent_at: Mapped[dt.datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
