"""Notification channels: digests sent somewhere besides e-mail, through Apprise.

A user keeps a list of channels, each an Apprise URL (``mailto://``, ``slack://``,
``discord://``, ``tgram://``, ``ntfy://``, ``matrix://``, ``json://`` webhooks, …).
Each cycle a channel gets one more *delivery* of the user's digest
(:class:`crawler_app.models.Delivery`), prepared, claimed, journaled and recorded
by the same machinery as the e-mail (:mod:`crawler_app.notify.digests`, the ``notify``
family), so it is sent at most once across crashes.

A channel may point at a host of the user's choosing (``json://HOST/…``,
``ntfy://HOST/…``, ``mailto://…?smtp=HOST``): those hosts pass the SSRF guard of the
page fetches (:mod:`crawler_app.fetching.guard`), when the channel is added and again on the
agent right before each send. Private and loopback addresses are refused unless the
operator names their network in ``JODL_CHANNEL_ALLOW``. Apprise makes its own
connections, so the address cannot be pinned as a fetch's is: a name whose DNS
answer changes between the check and the send is the remaining gap (see
docs/security.md).

:class:`Channel` is the interface; :class:`AppriseChannel` the one implementation.
The functions below are the channel operations the CLI, the web UI and the API share.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy.orm import Session

from jodl.exceptions import JodlError

from ..fetching.guard import FetchRefused, check_address, system_resolve
from ..models import URL_LENGTH, User, UserChannel
from . import queries

#: Channels one user may keep (each is one more message per changed cycle).
MAX_CHANNELS = 20

#: The operator setting that admits private networks for channels, named in refusals.
CHANNEL_ALLOW_SETTING = "JODL_CHANNEL_ALLOW"

#: Apprise services that deliver on the sending machine itself (its logs, its desktop),
#: not to the user: refused.
LOCAL_SCHEMES = frozenset(
    {"syslog", "dbus", "kde", "qt", "glib", "gnome", "windows", "macosx", "mqtt", "mqtts"}
)

#: Path segments longer than this are shown masked (tokens often sit in the path).
_SHOWN_SEGMENT = 6


class ChannelError(JodlError):
    """A channel that cannot be added, found or used (one-line message)."""


class ChannelRefused(ChannelError):
    """A channel the SSRF guard refuses (a private address not allowlisted)."""


class Channel:
    """How a digest reaches a user besides e-mail.

    A subclass needs three things: :meth:`check` refuses a target the operator did
    not allow (before anything is sent), :meth:`shown` says what the channel is
    without its secrets, and :meth:`send` delivers one message or raises
    :class:`ChannelError` saying why not. ``send`` is called at most once per
    digest and channel (the ``notify`` family's claim sees to that).
    """

    def check(self, allow: Iterable[str] = ()) -> None:
        """Raise :class:`ChannelRefused` if the channel reaches a refused address."""
        raise NotImplementedError

    def shown(self) -> str:
        """The channel as it may be displayed: secrets masked."""
        raise NotImplementedError

    def send(self, title: str, body: str) -> None:
        """Deliver one plain-text message; :class:`ChannelError` when it was not taken."""
        raise NotImplementedError


def _mask(segment: str) -> str:
    if len(segment) <= _SHOWN_SEGMENT or segment == "...":
        return segment
    return f"{segment[0]}...{segment[-1]}"


class AppriseChannel(Channel):
    """A channel given as an Apprise URL (https://github.com/caronc/apprise/wiki)."""

    def __init__(self, url: str) -> None:
        import apprise

        url = url.strip()
        if not url or len(url) > URL_LENGTH:
            raise ChannelError(f"a channel is an Apprise URL of at most {URL_LENGTH} characters")
        scheme = url.partition("://")[0].lower()
        if scheme in LOCAL_SCHEMES:
            raise ChannelError(
                f"{scheme}:// delivers on the server itself, not to you; "
                "use a service such as mailto://, ntfy:// or json://"
            )
        plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
        if not plugin:
            raise ChannelError(
                f"not an Apprise URL Apprise can use ({scheme or 'no'} scheme); see "
                "https://github.com/caronc/apprise/wiki for the services and their URLs"
            )
        self.url = url
        self._plugin = plugin

    def hosts(self) -> list[str]:
        """The hosts of the user's choosing this channel connects to ([] for a service
        at a fixed address, such as Slack's or Telegram's API)."""
        plugin = self._plugin
        templates = " ".join(getattr(plugin, "templates", ()) or ())
        found: list[str] = []
        if "{host}" in templates and getattr(plugin, "mode", None) != "cloud":
            found.append(str(getattr(plugin, "host", "") or ""))
        found.append(str(getattr(plugin, "smtp_host", "") or ""))  # mailto's SMTP server
        return [h.strip("[]").lower() for h in dict.fromkeys(found) if h]

    def check(self, allow: Iterable[str] = ()) -> None:
        allow = tuple(allow)
        for host in self.hosts():
            try:
                addresses = system_resolve(host, 0)
            except FetchRefused as exc:
                raise ChannelRefused(f"channel {self.shown()}: {exc.message}") from None
            for address in addresses:
                try:
                    check_address(address, allow)
                except FetchRefused:
                    raise ChannelRefused(
                        f"channel {self.shown()}: {host} is a private or loopback address, "
                        f"not a public one; an operator may allow its network with "
                        f"{CHANNEL_ALLOW_SETTING}"
                    ) from None

    def shown(self) -> str:
        private = self._plugin.url(privacy=True)
        parts = urlsplit(private)
        # The query holds options (and may hold tokens): left out.
        path = "/".join(_mask(seg) for seg in parts.path.split("/"))
        return f"{parts.scheme}://{parts.netloc}{path}"

    def send(self, title: str, body: str) -> None:
        import apprise

        notifier = apprise.Apprise()
        notifier.add(self._plugin)
        with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
            ok = notifier.notify(body=body, title=title, body_format=apprise.NotifyFormat.TEXT)
        if not ok:
            lines = [line.strip() for line in captured.getvalue().splitlines() if line.strip()]
            why = lines[-1] if lines else "the service did not accept the message"
            raise ChannelError(f"channel {self.shown()}: {why[:300]}")


def open_channel(url: str) -> Channel:
    """The :class:`Channel` for ``url`` (an Apprise URL); :class:`ChannelError` if none."""
    return AppriseChannel(url)


@dataclass(frozen=True)
class ChannelInfo:
    """A channel as listed to its user: its id and masked URL."""

    id: int
    shown: str


def add_channel(s: Session, user: User, url: str, allow: Iterable[str] = ()) -> ChannelInfo:
    """Add a channel for ``user`` after the guard's check; :class:`ChannelError` if not."""
    channel = open_channel(url)
    channel.check(allow)
    have = queries.channel_urls(s, user.id)
    if url.strip() in have:
        raise ChannelError(f"{user.email} has this channel already")
    if len(have) >= MAX_CHANNELS:
        raise ChannelError(f"at most {MAX_CHANNELS} channels per user; remove one first")
    row = UserChannel(user_id=user.id, url=url.strip())
    s.add(row)
    s.flush()
    return ChannelInfo(row.id, channel.shown())


def shown_url(url: str) -> str:
    """A stored channel URL masked for display (never the URL itself)."""
    try:
        return open_channel(url).shown()
    except ChannelError:
        return urlsplit(url).scheme + "://..."


def list_channels(s: Session, user_id: int) -> list[ChannelInfo]:
    """The user's channels, oldest first, masked."""
    rows = queries.channels_of(s, user_id)
    return [ChannelInfo(row.id, shown_url(row.url)) for row in rows]


def channel_of(s: Session, user_id: int, channel_id: int) -> UserChannel:
    """The user's channel ``channel_id``; :class:`ChannelError` if the user has none such."""
    row = queries.channel_by_id(s, user_id, channel_id)
    if row is None:
        raise ChannelError(f"no channel {channel_id} of this user")
    return row


def remove_channel(s: Session, user_id: int, channel_id: int) -> str:
    """Remove a channel; returns its masked URL."""
    row = channel_of(s, user_id, channel_id)
    shown = shown_url(row.url)
    s.delete(row)
    return shown


#: Title and body of a test message.
TEST_TITLE = "JODL: test notification"
TEST_BODY = "This channel receives a digest of your tracked pages when they change."


def send_test(url: str, allow: Iterable[str] = ()) -> str:
    """Send a test message to ``url`` now (from this process, after the guard's check);
    returns the masked URL; :class:`ChannelError` saying why it failed."""
    channel = open_channel(url)
    channel.check(allow)
    channel.send(TEST_TITLE, TEST_BODY)
    return channel.shown()
