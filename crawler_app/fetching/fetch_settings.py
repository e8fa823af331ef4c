"""How pages are fetched: the fetcher's settings and their defaults.

Apart from :mod:`crawler_app.fetching.fetcher` (httpx, lxml): the page checker's options
(:mod:`crawler_app.settings`) name these defaults, and every ``jodl`` process reads
the installed options at start, a master included.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .guard import parse_allowlist
from .politeness import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PAUSE,
    DEFAULT_MIN_INTERVAL,
    ROBOTS_CACHE_BYTES,
    ROBOTS_FAILURE_TTL,
    ROBOTS_TTL,
)

#: Sent with every request; its first word is the robots.txt agent name.
USER_AGENT = "JODL-PageChecker/0.1 (page change checker; obeys robots.txt)"
#: Seconds to open a connection (TCP and TLS).
CONNECT_TIMEOUT = 10.0
#: Seconds without a byte from the server before giving up.
READ_TIMEOUT = 20.0
#: Seconds of network time for one fetch, all hops and robots.txt included
#: (time spent waiting for a politeness slot is not counted).
TOTAL_TIMEOUT = 60.0
#: Largest body read, in bytes (after content decoding).
MAX_BYTES = 5 * 1024 * 1024
#: Redirects followed before giving up.
MAX_REDIRECTS = 5
#: Longest normalised text kept, in characters; the fingerprint covers what is kept.
MAX_TEXT_CHARS = 200_000
#: Media types fetched; an entry starting with "+" matches a suffix (``+xml``).
ACCEPTED_TYPES = (
    "text/html",
    "application/xhtml+xml",
    "text/plain",
    "text/xml",
    "application/xml",
    "application/json",
    "+xml",
    "+json",
)
#: Connections open at once across all hosts, per client.
MAX_CONNECTIONS = 100


@dataclass(frozen=True)
class FetchSettings:
    """How pages are fetched; every default is a named constant of this module."""

    user_agent: str = USER_AGENT
    connect_timeout: float = CONNECT_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    total_timeout: float = TOTAL_TIMEOUT
    max_bytes: int = MAX_BYTES
    max_redirects: int = MAX_REDIRECTS
    max_text_chars: int = MAX_TEXT_CHARS
    accepted_types: tuple[str, ...] = ACCEPTED_TYPES
    #: Networks admitted although not public, e.g. ("127.0.0.0/8",) for tests.
    allow_networks: tuple[str, ...] = ()
    obey_robots: bool = True
    #: Memory the robots.txt cache may hold (bytes, estimated), and how long it keeps an
    #: answer and a failure (seconds); see :class:`~crawler_app.fetching.politeness.RobotsCache`.
    robots_cache_bytes: int = ROBOTS_CACHE_BYTES
    robots_ttl: float = ROBOTS_TTL
    robots_failure_ttl: float = ROBOTS_FAILURE_TTL
    per_host_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    per_host_interval: float = DEFAULT_MIN_INTERVAL
    max_retry_after: float = DEFAULT_MAX_PAUSE
    max_connections: int = MAX_CONNECTIONS
    verify_tls: bool = True
    #: Extra CA certificates (PEM file) trusted besides the public ones, e.g. an intranet CA.
    ca_file: str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                allowed_zero = f.name in (
                    "max_redirects",
                    "per_host_interval",
                    "max_retry_after",
                    "robots_failure_ttl",
                )
                if value < 0 or (value == 0 and not allowed_zero):
                    raise ValueError(f"FetchSettings.{f.name} must be positive, not {value!r}")
        if not isinstance(self.allow_networks, tuple) or not isinstance(self.accepted_types, tuple):
            raise ValueError("FetchSettings.allow_networks and accepted_types must be tuples")
        parse_allowlist(self.allow_networks)  # raises ValueError naming a bad entry


#: Debian's Chromium: the browser pages are rendered in (no browser is ever downloaded).
BROWSER_PATH = "/usr/bin/chromium"
#: Seconds one rendering may take, the document's fetch excluded (a page that never
#: settles is an error, not a hang).
BROWSER_TIMEOUT = 30.0
#: Seconds the page's network must stay quiet after it loaded before its text is read
#: (scripts that fetch their data after the load event).
BROWSER_SETTLE = 2.0
#: Requests one rendering may make besides its document; those past it are refused.
BROWSER_MAX_REQUESTS = 100
#: Bytes all the answers to one rendering's requests may hold together.
BROWSER_MAX_BYTES = 10 * 1024 * 1024
#: Renderings at once per agent (each is a browser tab: about 50-100 MB).
BROWSER_PAGES = 2


@dataclass(frozen=True)
class BrowserSettings:
    """How pages are rendered (crawler_app.fetching.browser); every default is a named constant."""

    path: str = BROWSER_PATH
    timeout: float = BROWSER_TIMEOUT
    settle: float = BROWSER_SETTLE
    max_requests: int = BROWSER_MAX_REQUESTS
    max_bytes: int = BROWSER_MAX_BYTES
    pages: int = BROWSER_PAGES

    def __post_init__(self) -> None:
        for name in ("timeout", "max_requests", "max_bytes", "pages"):
            if getattr(self, name) <= 0:
                raise ValueError(f"BrowserSettings.{name} must be positive")
        if self.settle < 0:
            raise ValueError("BrowserSettings.settle must not be negative")


__all__ = [
    "ACCEPTED_TYPES",
    "BrowserSettings",
    "CONNECT_TIMEOUT",
    "MAX_BYTES",
    "MAX_CONNECTIONS",
    "MAX_REDIRECTS",
    "MAX_TEXT_CHARS",
    "READ_TIMEOUT",
    "TOTAL_TIMEOUT",
    "USER_AGENT",
    "FetchSettings",
]
