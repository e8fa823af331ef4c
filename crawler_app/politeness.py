"""Per-host politeness: how hard the page checker may hit one host.

For every host (by name) a :class:`Politeness` object keeps

* at most ``max_in_flight`` requests in flight at once;
* at least ``min_interval`` seconds between the starts of two requests (raised
  to the host's robots.txt ``Crawl-delay``, capped at :data:`MAX_CRAWL_DELAY`);
* a pause after a ``429`` or ``503`` answer carrying ``Retry-After``: no request
  starts before it ends (capped at ``max_pause``);
* its robots.txt rules (RFC 9309), fetched once per origin through the loader
  the fetcher gives, i.e. through the same guarded fetch path as pages.

One object serves one event loop: its locks belong to the loop that uses them.
The limits are kept per agent process; they hold across the cluster because the
master places every page of a host on one agent (``check_page`` uses the strict
``affinity`` strategy by host, see :data:`crawler_app.pages.CHECK_STRATEGY`).
"""

from __future__ import annotations

import asyncio
import email.utils
import time
import urllib.robotparser
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from jodl.metrics import POLITENESS_WAIT_SECONDS, POLITENESS_WAITS

from .guard import ParsedUrl

#: Requests to one host in flight at once (Scrapy uses 8; a page checker needs few).
DEFAULT_MAX_IN_FLIGHT = 2
#: Seconds between the starts of two requests to one host.
DEFAULT_MIN_INTERVAL = 1.0
#: Longest pause a ``Retry-After`` answer may impose on a host, in seconds.
DEFAULT_MAX_PAUSE = 600.0
#: Largest robots.txt ``Crawl-delay`` honoured, in seconds.
MAX_CRAWL_DELAY = 30.0
#: Bytes of robots.txt read; RFC 9309 asks parsers to read at least 500 KiB.
ROBOTS_MAX_BYTES = 512 * 1024

#: Fetches a robots.txt URL; returns (HTTP status, or None if unreachable, body text).
RobotsLoader = Callable[[str], Awaitable[tuple[int | None, str]]]


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or HTTP-date).

    Returns None when the header is absent or unreadable; never negative.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def robots_agent(user_agent: str) -> str:
    """The product token robots.txt groups are matched against (``Name`` of ``Name/1.0``)."""
    token = user_agent.split("/", 1)[0].split(" ", 1)[0].strip()
    return token or "*"


class RobotsRules:
    """The robots.txt verdict for one origin.

    Built with :meth:`from_response` following RFC 9309: a 2xx body is parsed;
    a 4xx (unavailable) allows everything; a 5xx, a 429 or no answer at all
    (unreachable) disallows everything.
    """

    def __init__(
        self, parser: urllib.robotparser.RobotFileParser | None, *, allow_all: bool, note: str
    ) -> None:
        self._parser = parser
        self._allow_all = allow_all
        self.note = note

    @classmethod
    def from_response(cls, status: int | None, text: str) -> RobotsRules:
        """Rules from the robots.txt answer: HTTP status (None: unreachable) and body."""
        if status is None:
            return cls(None, allow_all=False, note="robots.txt unreachable")
        if 200 <= status < 300:
            parser = urllib.robotparser.RobotFileParser()
            parser.parse(text.lstrip("\ufeff").splitlines())
            return cls(parser, allow_all=False, note="robots.txt")
        if status == 429 or status >= 500:
            return cls(None, allow_all=False, note=f"robots.txt answered {status}")
        return cls(None, allow_all=True, note=f"no robots.txt ({status})")

    def allows(self, url: str, agent: str) -> bool:
        """True if ``agent`` may fetch ``url``."""
        if self._parser is None:
            return self._allow_all
        return self._parser.can_fetch(agent, url)

    def crawl_delay(self, agent: str) -> float | None:
        """The ``Crawl-delay`` for ``agent`` in seconds, if the file sets one."""
        if self._parser is None:
            return None
        delay = self._parser.crawl_delay(agent)
        return float(delay) if delay is not None else None


@dataclass
class _Host:
    in_flight: asyncio.Semaphore
    interval: float
    start_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_start: float = 0.0  # loop time before which no request may start


class Politeness:
    """Per-host limits shared by all fetches of one fetcher (see the module doc)."""

    def __init__(
        self,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        min_interval: float = DEFAULT_MIN_INTERVAL,
        max_pause: float = DEFAULT_MAX_PAUSE,
        obey_robots: bool = True,
        user_agent: str = "*",
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if min_interval < 0 or max_pause < 0:
            raise ValueError("min_interval and max_pause must not be negative")
        self.max_in_flight = max_in_flight
        self.min_interval = min_interval
        self.max_pause = max_pause
        self.obey_robots = obey_robots
        self.agent = robots_agent(user_agent)
        self._hosts: dict[str, _Host] = {}
        self._robots: dict[str, RobotsRules] = {}
        self._robots_locks: dict[str, asyncio.Lock] = {}

    def _host(self, host: str) -> _Host:
        state = self._hosts.get(host)
        if state is None:
            state = _Host(asyncio.Semaphore(self.max_in_flight), self.min_interval)
            self._hosts[host] = state
        return state

    @asynccontextmanager
    async def slot(self, host: str) -> AsyncIterator[None]:
        """Hold one of ``host``'s in-flight places, started no sooner than allowed.

        The request is made inside the ``async with`` block; the place is free
        again when the block ends.
        """
        state = self._host(host)
        async with state.in_flight:
            async with state.start_lock:
                loop = asyncio.get_running_loop()
                # Re-read next_start after every sleep: a pause may have arrived.
                waited = loop.time()
                while (wait := state.next_start - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if (waited := loop.time() - waited) > 0.001:
                    POLITENESS_WAITS.inc()
                    POLITENESS_WAIT_SECONDS.inc(waited)
                state.next_start = loop.time() + state.interval
            yield

    def pause(self, host: str, seconds: float) -> float:
        """Start no request to ``host`` for ``seconds`` (capped); returns the pause applied."""
        seconds = max(0.0, min(seconds, self.max_pause))
        state = self._host(host)
        until = asyncio.get_running_loop().time() + seconds
        state.next_start = max(state.next_start, until)
        return seconds

    def note_response(self, host: str, status: int, retry_after: str | None) -> float | None:
        """Honour ``Retry-After`` on a 429 or 503 answer; returns the pause applied, if any."""
        if status not in (429, 503):
            return None
        seconds = parse_retry_after(retry_after)
        if seconds is None:
            return None
        return self.pause(host, seconds)

    def interval(self, host: str) -> float:
        """Current minimum spacing between request starts to ``host``, in seconds."""
        return self._host(host).interval

    async def robots_refusal(self, target: ParsedUrl, load: RobotsLoader) -> str | None:
        """None if robots.txt lets us fetch ``target``, else a one-line reason.

        The origin's robots.txt is loaded once (concurrent callers wait for the
        first) and cached for the life of this object.
        """
        if not self.obey_robots:
            return None
        rules = await self._rules(target, load)
        if rules.allows(target.url, self.agent):
            return None
        return f"{rules.note} disallows {target.url} for {self.agent}"

    async def _rules(self, target: ParsedUrl, load: RobotsLoader) -> RobotsRules:
        origin = target.origin
        rules = self._robots.get(origin)
        if rules is not None:
            return rules
        lock = self._robots_locks.setdefault(origin, asyncio.Lock())
        async with lock:
            rules = self._robots.get(origin)
            if rules is None:
                status, text = await load(f"{origin}/robots.txt")
                rules = RobotsRules.from_response(status, text)
                self._robots[origin] = rules
                delay = rules.crawl_delay(self.agent)
                if delay:
                    state = self._host(target.host)
                    state.interval = max(state.interval, min(delay, MAX_CRAWL_DELAY))
        return rules
