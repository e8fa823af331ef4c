"""Settings of the page checker: ``JODL_*`` options added to the library's one table.

The master reads the schedule, mail and retention options; agents read the
fetch and SMTP options from their own environment (job code runs there). Every
option is declared once here with :class:`jodl.settings.options.Option`, so ``jodl config``
prints them with the library's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from jodl.admin.families import cron_trigger  # one crontab reading for every schedule
from jodl.exceptions import ConfigError
from jodl.settings.config import read_values
from jodl.settings.options import Option, register_check, register_options

from .checking import confirm
from .fetching import fetch_settings, politeness, reach
from .fetching.guard import parse_allowlist

#: Cron expression of the application cycle run by ``jodl master`` (daily at 06:00).
DEFAULT_SCHEDULE = "0 6 * * *"
#: Seconds over which the checks of a scheduled cycle are spread (by a hash of the URL).
DEFAULT_CHECK_SPREAD = 300.0
#: Bounds of a tracking's interval (seconds): 5 minutes keeps one user from making the
#: cluster fetch a page every few seconds; 4 weeks keeps a forgotten page checked.
DEFAULT_CHECK_EVERY_MIN = 300
DEFAULT_CHECK_EVERY_MAX = 4 * 7 * 86400
#: Seconds between two looks for due pages: a page is checked at most this late.
DEFAULT_CHECK_TICK = 60
#: Confirmed snapshots kept per page view (older ones are deleted).
DEFAULT_SNAPSHOT_RETENTION = 50
#: Sender of the digests.
DEFAULT_MAIL_FROM = "JODL page checker <jodl@localhost>"


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected a whole number >= 0, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"expected a number >= 0, got {text!r}")
    return value


#: ``JODL_SCHEDULE`` value that turns the scheduled cycles off.
SCHEDULE_OFF = "off"


def _cron(text: str) -> str:
    text = text.strip()
    if text.lower() == SCHEDULE_OFF:
        return SCHEDULE_OFF
    try:
        cron_trigger(text)
    except ValueError as exc:
        raise ValueError(
            f"not a cron expression ([SEC] MIN HOUR DAY MONTH WEEKDAY) nor 'off': {exc}"
        ) from None
    return text


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(f"expected a port number, got {text!r}")
    return value


_LOCAL_PARSERS = {
    "int0": _non_negative_int,
    "float0": _non_negative_float,
    "cron": _cron,
    "port": _port,
}


@dataclass(frozen=True)
class AppOption(Option):
    """An :class:`Option` with the few extra kinds the page checker needs."""

    def parse(self, text: str) -> Any:
        parser = _LOCAL_PARSERS.get(self.kind)
        if parser is None:
            return super().parse(text)
        try:
            return parser(text)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{self.name}: {exc}") from None


FS = fetch_settings.FetchSettings()

OPTIONS: tuple[Option, ...] = (
    AppOption(
        "JODL_SCHEDULE",
        DEFAULT_SCHEDULE,
        "cron",
        "Cron expression (MIN HOUR DAY MONTH WEEKDAY, local time; an optional leading SEC "
        "field) of the trackings without a schedule of their own: `jodl master` checks "
        "their pages then; a run missed while the master was down runs once at start; "
        "`off`: such pages are checked by whatever cycle runs (docs/schedules.md)",
        "master",
    ),
    AppOption(
        "JODL_CHECK_SPREAD",
        str(DEFAULT_CHECK_SPREAD),
        "float0",
        "Seconds over which a scheduled cycle's checks start, ordered by a hash of the URL "
        "(0: all at once; never more than a quarter of the shortest interval among the due "
        "pages' schedules, nor of the time between two runs of JODL_SCHEDULE)",
        "master",
    ),
    AppOption(
        "JODL_CHECK_EVERY_MIN",
        str(DEFAULT_CHECK_EVERY_MIN),
        "int+",
        "Shortest interval in seconds a tracking may ask for (`jodl track --every`); a cron "
        "expression firing more often is refused too",
        "master, web",
    ),
    AppOption(
        "JODL_CHECK_EVERY_MAX",
        str(DEFAULT_CHECK_EVERY_MAX),
        "int+",
        "Longest interval in seconds a tracking may ask for (default 4 weeks)",
        "master, web",
    ),
    AppOption(
        "JODL_CHECK_TICK",
        str(DEFAULT_CHECK_TICK),
        "int+",
        "Seconds between two looks for due pages by `jodl master` (a cycle starts only when "
        "a page is due); a page is checked at most this late",
        "master",
    ),
    AppOption(
        "JODL_SNAPSHOT_RETENTION",
        str(DEFAULT_SNAPSHOT_RETENTION),
        "int+",
        "Confirmed snapshots kept per tracked page (and selector) for history and diffs",
        "master",
    ),
    AppOption(
        "JODL_CONFIRM_DELAY",
        str(confirm.DEFAULT_CONFIRM_DELAY),
        "float0",
        "Seconds before a page that differs from its baseline is fetched again",
        "agent",
    ),
    AppOption(
        "JODL_CONFIRM_FETCHES",
        str(confirm.DEFAULT_CONFIRM_FETCHES),
        "int0",
        "Fetches one check may add to confirm a difference (see docs/change-detection.md)",
        "agent",
    ),
    AppOption(
        "JODL_MAIL_FROM", DEFAULT_MAIL_FROM, "str", "From: address of the digest e-mails", "master"
    ),
    AppOption(
        "JODL_APP_URL",
        "",
        "str?",
        "Public URL of the web UI, linked from the e-mails (no link when empty)",
        "master",
    ),
    AppOption("JODL_SMTP_HOST", "localhost", "str", "SMTP server the agents send mail to", "agent"),
    AppOption("JODL_SMTP_PORT", "25", "port", "Port of the SMTP server", "agent"),
    AppOption("JODL_SMTP_USER", "", "str?", "SMTP login (none when empty)", "agent"),
    AppOption("JODL_SMTP_PASSWORD", "", "str?", "SMTP password", "agent"),
    AppOption(
        "JODL_SMTP_STARTTLS",
        "false",
        "bool",
        "Upgrade the SMTP session with STARTTLS (needed, or JODL_SMTP_SSL, with JODL_SMTP_USER)",
        "agent",
    ),
    AppOption(
        "JODL_SMTP_SSL",
        "false",
        "bool",
        "Talk to the SMTP server over implicit TLS (SMTPS, usually port 465)",
        "agent",
    ),
    AppOption("JODL_SMTP_TIMEOUT", "30", "float+", "Seconds an SMTP exchange may take", "agent"),
    AppOption(
        "JODL_FETCH_ALLOW",
        "",
        "list",
        "Comma-separated networks fetches may reach although not public "
        "(e.g. 10.1.0.0/16 for an intranet, 127.0.0.0/8 for tests); everything else private "
        "is refused; only jobs of users named in JODL_FETCH_ALLOW_USERS use it",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_ALLOW_USERS",
        reach.DEFAULT_USERS,
        "list",
        "Who may have pages fetched from the networks of JODL_FETCH_ALLOW: e-mail addresses "
        "of users, `operators` (the admin role) or `*` (every user); visitors who are not "
        "signed in never; a tracked page when one of its trackers may (set where jobs are "
        "queued: masters, `jodl web`, the CLI)",
        "master",
    ),
    AppOption(
        "JODL_CHANNEL_ALLOW",
        "",
        "list",
        "Comma-separated networks notification channels (Apprise URLs such as json://, "
        "ntfy://, mailto://) may reach although not public; checked where channels are "
        "added and on the agents that send; everything else private is refused",
        "agent",
    ),
    AppOption("JODL_FETCH_USER_AGENT", FS.user_agent, "str", "User-Agent of every fetch", "agent"),
    AppOption(
        "JODL_FETCH_CONNECT_TIMEOUT",
        str(FS.connect_timeout),
        "float+",
        "Seconds to connect",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_READ_TIMEOUT",
        str(FS.read_timeout),
        "float+",
        "Seconds without a byte before a fetch gives up",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_TOTAL_TIMEOUT",
        str(FS.total_timeout),
        "float+",
        "Seconds of network time one fetch may take, redirects included",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_MAX_BYTES", str(FS.max_bytes), "int+", "Largest page body read (bytes)", "agent"
    ),
    AppOption(
        "JODL_FETCH_MAX_REDIRECTS", str(FS.max_redirects), "int0", "Redirects followed", "agent"
    ),
    AppOption(
        "JODL_FETCH_ACCEPT",
        ",".join(FS.accepted_types),
        "list",
        "Media types fetched (an entry +xml matches a suffix); others are an error",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_HOST_IN_FLIGHT",
        str(politeness.DEFAULT_MAX_IN_FLIGHT),
        "int+",
        "Requests to one host in flight at once, per agent",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_HOST_INTERVAL",
        str(politeness.DEFAULT_MIN_INTERVAL),
        "float0",
        "Seconds between the starts of two requests to one host, per agent "
        "(raised to the host's robots.txt Crawl-delay)",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_MAX_RETRY_AFTER",
        str(politeness.DEFAULT_MAX_PAUSE),
        "float0",
        "Longest pause a host's Retry-After may impose (seconds)",
        "agent",
    ),
    AppOption("JODL_FETCH_ROBOTS", "true", "bool", "Obey robots.txt", "agent"),
    AppOption(
        "JODL_FETCH_ROBOTS_CACHE_BYTES",
        str(FS.robots_cache_bytes),
        "int+",
        "Memory the robots.txt cache may hold per agent (bytes, estimated); least recently "
        "used origins go first",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_ROBOTS_TTL",
        str(FS.robots_ttl),
        "float+",
        "Seconds a robots.txt is used before it is fetched again (RFC 9309: at most a day)",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_ROBOTS_FAILURE_TTL",
        str(FS.robots_failure_ttl),
        "float0",
        "Seconds a robots.txt failure (unreachable, 429, 5xx) is remembered",
        "agent",
    ),
    AppOption(
        "JODL_BROWSER_PATH",
        fetch_settings.BROWSER_PATH,
        "str",
        "The Chromium that renders pages whose trackers turned the browser on "
        "(Debian's package; nothing downloads a browser)",
        "agent",
    ),
    AppOption(
        "JODL_BROWSER_TIMEOUT",
        str(fetch_settings.BROWSER_TIMEOUT),
        "float+",
        "Seconds one rendering may take after the page's document was fetched",
        "agent",
    ),
    AppOption(
        "JODL_BROWSER_SETTLE",
        str(fetch_settings.BROWSER_SETTLE),
        "float0",
        "Seconds a rendered page's network must stay quiet before its text is read",
        "agent",
    ),
    AppOption(
        "JODL_BROWSER_MAX_REQUESTS",
        str(fetch_settings.BROWSER_MAX_REQUESTS),
        "int+",
        "Requests one rendering may make besides its document (more are refused)",
        "agent",
    ),
    AppOption(
        "JODL_BROWSER_MAX_BYTES",
        str(fetch_settings.BROWSER_MAX_BYTES),
        "int+",
        "Bytes the answers to one rendering's requests may hold together",
        "agent",
    ),
    AppOption(
        "JODL_BROWSER_PAGES",
        str(fetch_settings.BROWSER_PAGES),
        "int+",
        "Pages rendered at once per agent",
        "agent",
    ),
    AppOption(
        "JODL_FETCH_MAX_CONNECTIONS",
        str(FS.max_connections),
        "int+",
        "Connections open at once per agent, all hosts together",
        "agent",
    ),
)

register_options(OPTIONS)

#: Why a username without TLS is refused: the password would cross the network in clear.
SMTP_IN_CLEAR = (
    "JODL_SMTP_USER is set but neither JODL_SMTP_STARTTLS nor JODL_SMTP_SSL: refusing "
    "to send the SMTP password unencrypted; turn one of them on"
)


@dataclass(frozen=True)
class AppSettings:
    """The page checker's settings; build with :meth:`from_env`."""

    schedule: str = DEFAULT_SCHEDULE
    check_spread: float = DEFAULT_CHECK_SPREAD
    check_every_min: int = DEFAULT_CHECK_EVERY_MIN
    check_every_max: int = DEFAULT_CHECK_EVERY_MAX
    check_tick: int = DEFAULT_CHECK_TICK
    snapshot_retention: int = DEFAULT_SNAPSHOT_RETENTION
    confirm_delay: float = confirm.DEFAULT_CONFIRM_DELAY
    confirm_fetches: int = confirm.DEFAULT_CONFIRM_FETCHES
    mail_from: str = DEFAULT_MAIL_FROM
    app_url: str | None = None
    smtp_host: str = "localhost"
    smtp_port: int = 25
    smtp_user: str | None = None
    smtp_password: str | None = None
    smtp_starttls: bool = False
    smtp_ssl: bool = False
    smtp_timeout: float = 30.0
    fetch_allow: tuple[str, ...] = ()
    fetch_allow_users: tuple[str, ...] = (reach.DEFAULT_USERS,)
    channel_allow: tuple[str, ...] = ()
    fetch_user_agent: str = FS.user_agent
    fetch_connect_timeout: float = FS.connect_timeout
    fetch_read_timeout: float = FS.read_timeout
    fetch_total_timeout: float = FS.total_timeout
    fetch_max_bytes: int = FS.max_bytes
    fetch_max_redirects: int = FS.max_redirects
    fetch_accept: tuple[str, ...] = FS.accepted_types
    fetch_host_in_flight: int = politeness.DEFAULT_MAX_IN_FLIGHT
    fetch_host_interval: float = politeness.DEFAULT_MIN_INTERVAL
    fetch_max_retry_after: float = politeness.DEFAULT_MAX_PAUSE
    fetch_robots: bool = True
    fetch_robots_cache_bytes: int = FS.robots_cache_bytes
    fetch_robots_ttl: float = FS.robots_ttl
    fetch_robots_failure_ttl: float = FS.robots_failure_ttl
    fetch_max_connections: int = FS.max_connections
    browser_path: str = fetch_settings.BROWSER_PATH
    browser_timeout: float = fetch_settings.BROWSER_TIMEOUT
    browser_settle: float = fetch_settings.BROWSER_SETTLE
    browser_max_requests: int = fetch_settings.BROWSER_MAX_REQUESTS
    browser_max_bytes: int = fetch_settings.BROWSER_MAX_BYTES
    browser_pages: int = fetch_settings.BROWSER_PAGES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AppSettings:
        """Read every option from ``env`` (default: the process environment) and the file."""
        values = read_values(OPTIONS, env)
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if k in known}
        values.update(overrides)
        settings = cls(**values)
        try:
            parse_allowlist(tuple(settings.fetch_allow))
        except ValueError as exc:
            raise ConfigError(f"JODL_FETCH_ALLOW: {exc}") from None
        settings.allow_users()
        try:
            parse_allowlist(tuple(settings.channel_allow))
        except ValueError as exc:
            raise ConfigError(f"JODL_CHANNEL_ALLOW: {exc}") from None
        if settings.check_every_min > settings.check_every_max:
            raise ConfigError(
                f"JODL_CHECK_EVERY_MIN ({settings.check_every_min}) is above "
                f"JODL_CHECK_EVERY_MAX ({settings.check_every_max})"
            )
        settings.fetch_settings()
        settings.browser_settings()
        if settings.smtp_user and not (settings.smtp_starttls or settings.smtp_ssl):
            raise ConfigError(SMTP_IN_CLEAR)
        return settings

    def allow_users(self) -> reach.AllowUsers:
        """Who may use the fetch allowlist (``JODL_FETCH_ALLOW_USERS``)."""
        try:
            return reach.AllowUsers.parse(self.fetch_allow_users)
        except ValueError as exc:
            raise ConfigError(f"{reach.USERS_SETTING}: {exc}") from None

    def fetch_settings(self) -> fetch_settings.FetchSettings:
        """The fetcher's settings from these options."""
        try:
            return fetch_settings.FetchSettings(
                user_agent=self.fetch_user_agent,
                connect_timeout=self.fetch_connect_timeout,
                read_timeout=self.fetch_read_timeout,
                total_timeout=self.fetch_total_timeout,
                max_bytes=self.fetch_max_bytes,
                max_redirects=self.fetch_max_redirects,
                accepted_types=tuple(self.fetch_accept),
                allow_networks=tuple(self.fetch_allow),
                obey_robots=self.fetch_robots,
                robots_cache_bytes=self.fetch_robots_cache_bytes,
                robots_ttl=self.fetch_robots_ttl,
                robots_failure_ttl=self.fetch_robots_failure_ttl,
                per_host_in_flight=self.fetch_host_in_flight,
                per_host_interval=self.fetch_host_interval,
                max_retry_after=self.fetch_max_retry_after,
                max_connections=self.fetch_max_connections,
            )
        except ValueError as exc:
            raise ConfigError(f"JODL_FETCH_*: {exc}") from None

    def browser_settings(self) -> fetch_settings.BrowserSettings:
        """The renderer's settings from these options."""
        try:
            return fetch_settings.BrowserSettings(
                path=self.browser_path,
                timeout=self.browser_timeout,
                settle=self.browser_settle,
                max_requests=self.browser_max_requests,
                max_bytes=self.browser_max_bytes,
                pages=self.browser_pages,
            )
        except ValueError as exc:
            raise ConfigError(f"JODL_BROWSER_*: {exc}") from None


def _check(env: Mapping[str, str]) -> None:
    """``jodl config``'s check of the page checker's settings across values."""
    AppSettings.from_env(env)


register_check(_check)
