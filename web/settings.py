"""Settings of the web UI: ``JODL_WEB_*`` options added to the one configuration table."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from jodl.config import Option, read_values, register_options
from jodl.exceptions import ConfigError

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
#: Seconds between two looks of an event stream at the log for new results.
DEFAULT_STREAM_POLL = 0.1
#: Seconds an event stream stays open; the browser then resumes it (Last-Event-ID).
DEFAULT_STREAM_SECONDS = 300.0
#: Seconds between keep-alive comments on a quiet stream.
DEFAULT_KEEPALIVE = 15.0

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
        "Submissions (and login attempts) per minute per user or client address",
        "web",
    ),
    Option(
        "JODL_WEB_SUBMIT_BURST",
        str(DEFAULT_SUBMIT_BURST),
        "int+",
        "Submissions a client may make at once before the per-minute rate applies",
        "web",
    ),
    Option(
        "JODL_WEB_STREAM_POLL",
        str(DEFAULT_STREAM_POLL),
        "float+",
        "Seconds between two looks of an open event stream at the log for new results",
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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WebSettings:
        """Read the options from ``env`` (default: the process environment) and the file."""
        from jodl.config import OPTIONS as LIBRARY

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
        settings = cls(**values)
        settings.validate()
        return settings

    def replace(self, **changes: Any) -> WebSettings:
        return replace(self, **changes)

    def validate(self) -> None:
        if self.web_max_streams >= self.web_threads:
            raise ConfigError(
                f"JODL_WEB_MAX_STREAMS ({self.web_max_streams}) must be below "
                f"JODL_WEB_THREADS ({self.web_threads}), or streams could take every thread"
            )

    def secret_key(self) -> str:
        """The session signing key: the configured one, else a random one for this process."""
        return self.web_secret_key or secrets.token_urlsafe(32)
