"""Settings of the web UI: ``JODL_WEB_*`` options added to the one configuration table."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

# The page checker's options register first, whichever module is imported first:
# the configuration table keeps one order.
from crawler_app import AppSettings
from jodl.exceptions import ConfigError
from jodl.settings.config import read_values
from jodl.settings.options import Option, register_options

#: Address ``jodl web`` listens on (loopback: put a TLS proxy in front for the world).
DEFAULT_LISTEN = "127.0.0.1:8080"
#: Worker threads of the WSGI server.
DEFAULT_THREADS = 32
#: Open event streams at most; the other threads stay free for ordinary requests.
DEFAULT_MAX_STREAMS = 24
#: URLs accepted in one submission at most.
DEFAULT_BATCH_MAX = 100
#: Longest accepted URL (characters), as the page checker stores them.
DEFAULT_URL_MAX = 2048
#: Seconds a good result answers a new submission of its URL from the cache.
DEFAULT_CACHE_TTL = 600.0
#: Share of good cached answers queued again to refresh them.
DEFAULT_REFRESH_FRACTION = 0.1
#: Submissions per minute per client (user or address), and the burst allowed.
DEFAULT_SUBMIT_PER_MINUTE = 30.0
DEFAULT_SUBMIT_BURST = 10
#: Seconds between two looks of an event stream at the log when no notice of results can
#: come (web/stream.py); 0.1 s keeps such a stream within a tenth of a second of a result.
DEFAULT_STREAM_POLL = 0.1
#: Seconds an event stream stays open; the browser then resumes it (Last-Event-ID).
DEFAULT_STREAM_SECONDS = 300.0
#: Seconds between keep-alive comments on a quiet stream.
DEFAULT_KEEPALIVE = 15.0
#: Anonymous visitors' submissions: per minute and burst per address, URLs per
#: submission. Much smaller than a signed-in user's: each URL makes an agent fetch.
DEFAULT_ANONYMOUS_PER_MINUTE = 6.0
DEFAULT_ANONYMOUS_BURST = 3
DEFAULT_ANONYMOUS_BATCH_MAX = 10
#: Event streams one signed-in user, and one client address, may hold open at once.
DEFAULT_STREAMS_PER_CLIENT = 4
#: Event streams kept for operators' live views, apart from everyone else's.
DEFAULT_OPERATOR_STREAMS = 4
#: Who may read /metrics: "loopback" (clients on this machine, and operators),
#: "operators" (signed-in operators only) or "public".
METRICS_ACCESS = ("loopback", "operators", "public")
#: Host names always trusted in the Host header (besides the listen host).
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")

OPTIONS: tuple[Option, ...] = (
    Option("JODL_WEB_LISTEN", DEFAULT_LISTEN, "host:port", "Address `jodl web` listens on", "web"),
    Option(
        "JODL_WEB_THREADS",
        str(DEFAULT_THREADS),
        "int+",
        "Worker threads of the web server (each open event stream holds one)",
        "web",
    ),
    Option(
        "JODL_WEB_MAX_STREAMS",
        str(DEFAULT_MAX_STREAMS),
        "int+",
        "Event streams open at once at most (fewer than JODL_WEB_THREADS, so pages never "
        "wait behind streams); a browser over the limit retries a moment later",
        "web",
    ),
    Option(
        "JODL_WEB_SECRET_KEY",
        "",
        "str?",
        "Key signing the session cookies (random per start when empty: logins end at restart; "
        "set it when several web processes serve one site)",
        "web",
    ),
    Option(
        "JODL_WEB_SECURE_COOKIES",
        "true",
        "bool",
        "Send the session cookie over HTTPS only (turn off only for plain-HTTP loopback use)",
        "web",
    ),
    Option(
        "JODL_WEB_SIGNUP",
        "true",
        "bool",
        "Let visitors create their own accounts",
        "web",
    ),
    Option(
        "JODL_WEB_BATCH_MAX",
        str(DEFAULT_BATCH_MAX),
        "int+",
        "URLs accepted in one submission at most",
        "web",
    ),
    Option(
        "JODL_WEB_CACHE_TTL",
        str(DEFAULT_CACHE_TTL),
        "float+",
        "Seconds a good result of a URL answers new submissions at once (cache)",
        "web",
    ),
    Option(
        "JODL_WEB_REFRESH_FRACTION",
        str(DEFAULT_REFRESH_FRACTION),
        "fraction",
        "Random share of good cached answers that are also fetched again to refresh the "
        "cache (error results are always fetched again)",
        "web",
    ),
    Option(
        "JODL_WEB_SUBMIT_PER_MINUTE",
        str(DEFAULT_SUBMIT_PER_MINUTE),
        "float+",
        "Submissions per minute per signed-in user",
        "web",
    ),
    Option(
        "JODL_WEB_SUBMIT_BURST",
        str(DEFAULT_SUBMIT_BURST),
        "int+",
        "Submissions a signed-in user may make at once before the per-minute rate applies; "
        "also failed logins per (address, account) per 15 minutes (five times as many "
        "per address over all accounts)",
        "web",
    ),
    Option(
        "JODL_WEB_STREAM_POLL",
        str(DEFAULT_STREAM_POLL),
        "float+",
        "Seconds between two looks at the log for new results of the open event streams "
        "(one look for all of them) when no notice of them can come (SQLite with the "
        "master in another process, or PostgreSQL's LISTEN connection down); else "
        "streams are woken by each result",
        "web",
    ),
    Option(
        "JODL_WEB_STREAM_SECONDS",
        str(DEFAULT_STREAM_SECONDS),
        "float+",
        "Seconds an event stream stays open before the browser resumes it",
        "web",
    ),
    Option(
        "JODL_WEB_ANONYMOUS_SUBMIT",
        "false",
        "bool",
        "Let visitors who are not signed in submit URLs (each makes an agent fetch; "
        "`jodl up` turns it on unless set); their jobs never reach the networks of the "
        "fetch allowlist (JODL_FETCH_ALLOW_USERS)",
        "web",
    ),
    Option(
        "JODL_WEB_ANONYMOUS_PER_MINUTE",
        str(DEFAULT_ANONYMOUS_PER_MINUTE),
        "float+",
        "Submissions per minute per address of visitors who are not signed in",
        "web",
    ),
    Option(
        "JODL_WEB_ANONYMOUS_BURST",
        str(DEFAULT_ANONYMOUS_BURST),
        "int+",
        "Submissions a visitor who is not signed in may make at once",
        "web",
    ),
    Option(
        "JODL_WEB_ANONYMOUS_BATCH_MAX",
        str(DEFAULT_ANONYMOUS_BATCH_MAX),
        "int+",
        "URLs in one submission of a visitor who is not signed in at most",
        "web",
    ),
    Option(
        "JODL_WEB_STREAMS_PER_CLIENT",
        str(DEFAULT_STREAMS_PER_CLIENT),
        "int+",
        "Event streams one signed-in user, and one client address, may hold open at once",
        "web",
    ),
    Option(
        "JODL_WEB_OPERATOR_STREAMS",
        str(DEFAULT_OPERATOR_STREAMS),
        "int+",
        "Event streams kept for operators (their own pool, apart from JODL_WEB_MAX_STREAMS)",
        "web",
    ),
    Option(
        "JODL_WEB_METRICS_ACCESS",
        "loopback",
        "str",
        "Who may read /metrics: loopback (clients on this machine, and operators), "
        "operators, or public",
        "web",
    ),
    Option(
        "JODL_WEB_TRUSTED_HOSTS",
        "",
        "list",
        "Host names the web UI answers to (Host header; against DNS rebinding); empty: "
        "the listen host and localhost names. A leading dot admits subdomains",
        "web",
    ),
    Option(
        "JODL_WEB_PROXIES",
        "0",
        "str",
        "Reverse proxies in front of the web server whose X-Forwarded-For/-Proto to trust",
        "web",
    ),
)
register_options(OPTIONS)


@dataclass(frozen=True)
class WebSettings:
    """The web UI's settings; build with :meth:`from_env`."""

    database_url: str = "sqlite:///jodl.db"
    web_listen: str = DEFAULT_LISTEN
    web_threads: int = DEFAULT_THREADS
    web_max_streams: int = DEFAULT_MAX_STREAMS
    web_secret_key: str | None = None
    web_secure_cookies: bool = True
    web_signup: bool = True
    web_batch_max: int = DEFAULT_BATCH_MAX
    web_url_max: int = DEFAULT_URL_MAX
    web_cache_ttl: float = DEFAULT_CACHE_TTL
    web_refresh_fraction: float = DEFAULT_REFRESH_FRACTION
    web_submit_per_minute: float = DEFAULT_SUBMIT_PER_MINUTE
    web_submit_burst: int = DEFAULT_SUBMIT_BURST
    web_stream_poll: float = DEFAULT_STREAM_POLL
    web_stream_seconds: float = DEFAULT_STREAM_SECONDS
    web_keepalive: float = DEFAULT_KEEPALIVE
    web_proxies: int = 0
    web_anonymous_submit: bool = False
    web_anonymous_per_minute: float = DEFAULT_ANONYMOUS_PER_MINUTE
    web_anonymous_burst: int = DEFAULT_ANONYMOUS_BURST
    web_anonymous_batch_max: int = DEFAULT_ANONYMOUS_BATCH_MAX
    web_streams_per_client: int = DEFAULT_STREAMS_PER_CLIENT
    web_operator_streams: int = DEFAULT_OPERATOR_STREAMS
    web_metrics_access: str = "loopback"
    web_trusted_hosts: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WebSettings:
        """Read the options from ``env`` (default: the process environment) and the file."""
        from jodl.settings.config import OPTIONS as LIBRARY

        database = next(o for o in LIBRARY if o.name == "JODL_DATABASE_URL")
        values = read_values((database, *OPTIONS), env)
        try:
            values["web_proxies"] = int(values["web_proxies"])
            if values["web_proxies"] < 0:
                raise ValueError
        except ValueError:
            raise ConfigError("JODL_WEB_PROXIES: expected a whole number >= 0") from None
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if k in known}
        values.update({k: v for k, v in overrides.items() if v is not None})
        threads = values.get("web_threads", DEFAULT_THREADS)
        if not _given("JODL_WEB_MAX_STREAMS", env) and values["web_max_streams"] >= threads:
            # Fewer threads than the default streams need: streams take what pages spare.
            values["web_max_streams"] = max(1, threads - max(2, threads // 4))
        spare = threads - values["web_max_streams"] - 1
        if not _given("JODL_WEB_OPERATOR_STREAMS", env) and values["web_operator_streams"] > spare:
            values["web_operator_streams"] = max(1, spare)
        settings = cls(**values)
        settings.validate()
        return settings

    def replace(self, **changes: Any) -> WebSettings:
        return replace(self, **changes)

    @classmethod
    def for_up(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WebSettings:
        """The settings of ``jodl up``: a local trial, so plain-HTTP cookies and
        anonymous submissions, each unless the operator set it."""
        settings = cls.from_env(env, **overrides)
        changes: dict[str, Any] = {}
        if not _given("JODL_WEB_SECURE_COOKIES", env):
            changes["web_secure_cookies"] = False
        if not _given("JODL_WEB_ANONYMOUS_SUBMIT", env):
            changes["web_anonymous_submit"] = True
        return settings.replace(**changes)

    def validate(self) -> None:
        if self.web_metrics_access not in METRICS_ACCESS:
            raise ConfigError(
                f"JODL_WEB_METRICS_ACCESS: expected one of {', '.join(METRICS_ACCESS)}, "
                f"got {self.web_metrics_access!r}"
            )
        if self.web_max_streams >= self.web_threads:
            raise ConfigError(
                f"JODL_WEB_MAX_STREAMS ({self.web_max_streams}) must be below "
                f"JODL_WEB_THREADS ({self.web_threads}), or streams could take every thread"
            )
        if self.web_max_streams + self.web_operator_streams > self.web_threads:
            raise ConfigError(
                f"JODL_WEB_MAX_STREAMS ({self.web_max_streams}) plus JODL_WEB_OPERATOR_STREAMS "
                f"({self.web_operator_streams}) must not exceed JODL_WEB_THREADS "
                f"({self.web_threads})"
            )

    def trusted_hosts(self, listen: str | None = None) -> list[str]:
        """Host names the Host header may carry: the setting, else the listen host's
        name and the localhost names (any host of this machine when listening on all)."""
        if self.web_trusted_hosts:
            return list(self.web_trusted_hosts)
        host = (listen or self.web_listen).rpartition(":")[0].strip("[]")
        names = list(LOCAL_HOSTS)
        if host in ("", "0.0.0.0", "::"):
            names += [socket.gethostname(), socket.getfqdn()]
        elif host not in names:
            names.append(host)
        return names

    def secret_key(self) -> str:
        """The session signing key: the configured one, else a random one for this process."""
        return self.web_secret_key or secrets.token_urlsafe(32)


def up_app_url(served: str, env: Mapping[str, str] | None = None) -> str | None:
    """The ``JODL_APP_URL`` ``jodl up`` sets (digests and confirmation mails link to it):
    ``served``, the URL its web UI answers on.

    None when the operator set one (in ``env``, default the process environment, or
    the ``JODL_CONFIG`` file): theirs holds. A server on every interface is named by
    this machine's name, which a reader of the mail can open (0.0.0.0 they cannot).
    """
    from urllib.parse import urlsplit, urlunsplit

    if AppSettings.from_env(env).app_url:
        return None
    parts = urlsplit(served)
    if parts.hostname in ("0.0.0.0", "::"):
        parts = parts._replace(netloc=f"{socket.getfqdn()}:{parts.port}")
    return urlunsplit(parts)


def _given(name: str, env: Mapping[str, str] | None) -> bool:
    """True when the operator set option ``name`` (environment or configuration file)."""
    probe = Option(name, "", "str?", "", "web")
    return read_values((probe,), env)[probe.attr] is not None
