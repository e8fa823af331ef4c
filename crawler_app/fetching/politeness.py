"""Per-host politeness: how hard the page checker may hit one host.

For every host (by name) a :class:`Politeness` object keeps

* at most ``max_in_flight`` requests in flight at once;
* at least ``min_interval`` seconds between the starts of two requests (raised
  to the host's robots.txt ``Crawl-delay``, capped at :data:`MAX_CRAWL_DELAY`);
* a pause after a ``429`` or ``503`` answer carrying ``Retry-After``: no request
  starts before it ends (capped at ``max_pause``);
* its robots.txt rules (RFC 9309: ``*`` and ``$`` in paths, the longest match wins,
  ``Allow`` on a tie; parsed by Protego, Scrapy's parser, because the standard
  library's ``urllib.robotparser`` implements none of these), fetched through the loader the fetcher
  gives, i.e. through the same guarded fetch path as pages, and kept in a
  :class:`RobotsCache`: least recently used first out under a byte budget,
  each entry for a time to live (24 h, as RFC 9309 asks), a failure only for
  a few minutes.

One object serves one event loop: its locks belong to the loop that uses them.
The limits are kept per agent process; they hold across the cluster because the
master places every page of a host on one agent (``check_page`` uses the strict
``affinity`` strategy by host, see :data:`crawler_app.users.pages.CHECK_STRATEGY`).
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from protego import Protego

from ..metrics import POLITENESS_WAIT_SECONDS, POLITENESS_WAITS
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

#: Seconds a robots.txt answer is used before it is fetched again (RFC 9309, 2.4: 24 h).
ROBOTS_TTL = 24 * 3600.0
#: Seconds a failure (unreachable, 429, 5xx) is kept: long enough that a down host is not
#: asked for robots.txt by every page, short enough that a blip is soon forgotten.
ROBOTS_FAILURE_TTL = 300.0
#: Memory the robots.txt cache may hold, in bytes (estimated, see ``RobotsRules.cost``):
#: about a thousand origins with a typical 1 KiB file, or two at the 512 KiB limit.
ROBOTS_CACHE_BYTES = 64 * 1024 * 1024
#: Parsed rules cost at most this many bytes per byte of robots.txt (measured with
#: tracemalloc on Protego 0.7: 47 for 512 KiB of wildcard rules; comments cost nothing,
#: so the estimate errs high), plus a fixed overhead per origin.
_ROBOTS_BYTES_PER_CHAR = 48
_ROBOTS_ENTRY_OVERHEAD = 2048


class RobotsAnswer(NamedTuple):
    """What fetching robots.txt gave: an HTTP status and body, or why there was none.

    ``status`` None means unreachable; ``failure`` then holds ``(code, message)``: the
    error code and one line saying why (a connection refused, a timeout …).
    """

    status: int | None
    text: str = ""
    failure: tuple[str, str] | None = None


#: Fetches a robots.txt URL.
RobotsLoader = Callable[[str], Awaitable[RobotsAnswer]]


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
        self,
        parser: Protego | None,
        *,
        allow_all: bool,
        note: str,
        failure: tuple[str, str] | None = None,
        size: int = 0,
    ) -> None:
        self._parser = parser
        self._allow_all = allow_all
        self.note = note
        #: (code, message) when robots.txt could not be fetched at all.
        self.failure = failure
        #: Estimated bytes of memory these rules hold.
        self.cost = _ROBOTS_ENTRY_OVERHEAD + _ROBOTS_BYTES_PER_CHAR * size

    @property
    def failed(self) -> bool:
        """True for a temporary verdict: robots.txt unreachable, 429 or 5xx."""
        return self._parser is None and not self._allow_all

    @classmethod
    def from_response(cls, answer: RobotsAnswer) -> RobotsRules:
        """Rules from the robots.txt answer (see :class:`RobotsAnswer`)."""
        status, text = answer.status, answer.text
        if status is None:
            return cls(None, allow_all=False, note="robots.txt unreachable", failure=answer.failure)
        if 200 <= status < 300:
            parser = Protego.parse(text.lstrip("\ufeff"))
            return cls(parser, allow_all=False, note="robots.txt", size=len(text))
        if status == 429 or status >= 500:
            return cls(None, allow_all=False, note=f"robots.txt answered {status}")
        return cls(None, allow_all=True, note=f"no robots.txt ({status})")

    def allows(self, url: str, agent: str) -> bool:
        """True if ``agent`` may fetch ``url``."""
        if self._parser is None:
            return self._allow_all
        return bool(self._parser.can_fetch(url, agent))

    def crawl_delay(self, agent: str) -> float | None:
        """The ``Crawl-delay`` for ``agent`` in seconds, if the file sets one."""
        if self._parser is None:
            return None
        delay = self._parser.crawl_delay(agent)
        return float(delay) if delay is not None else None


class RobotsCache:
    """robots.txt rules per origin: an LRU under a byte budget, each entry with a lifetime.

    ``budget`` bounds the summed :attr:`RobotsRules.cost` (rules costing more are
    used once and not kept); ``ttl`` is the lifetime of an answer, ``failure_ttl`` that
    of a failure (:attr:`RobotsRules.failed`). An expired entry is fetched again; if
    that fails while the expired rules were a real robots.txt, the old rules serve on
    for ``failure_ttl`` (RFC 9309, 2.4: a cached copy may be used while unreachable).
    ``clock`` gives seconds (monotonic).
    """

    def __init__(
        self,
        *,
        budget: int = ROBOTS_CACHE_BYTES,
        ttl: float = ROBOTS_TTL,
        failure_ttl: float = ROBOTS_FAILURE_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget
        self.ttl = ttl
        self.failure_ttl = failure_ttl
        self._clock = clock
        # origin -> (rules, expires at); least recently used first
        self._entries: OrderedDict[str, tuple[RobotsRules, float]] = OrderedDict()
        self.size = 0  # summed cost of the entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, origin: str) -> RobotsRules | None:
        """The live rules of ``origin``, or None when missing or expired."""
        entry = self._entries.get(origin)
        if entry is None or entry[1] <= self._clock():
            return None
        self._entries.move_to_end(origin)
        return entry[0]

    def put(self, origin: str, rules: RobotsRules) -> RobotsRules:
        """Keep ``rules`` for ``origin``; returns the rules to use now (see the class doc)."""
        lifetime = self.failure_ttl if rules.failed else self.ttl
        old = self._entries.pop(origin, None)
        if old is not None:
            previous = old[0]
            self.size -= previous.cost
            if rules.failed and not previous.failed:
                rules = previous  # the last real answer serves while the host fails
        if rules.cost > self.budget:
            return rules
        self._entries[origin] = (rules, self._clock() + lifetime)
        self.size += rules.cost
        while self.size > self.budget:
            _origin, (evicted, _expires) = self._entries.popitem(last=False)
            self.size -= evicted.cost
        return rules


@dataclass
class _Host:
    in_flight: asyncio.Semaphore
    interval: float
    start_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_start: float = 0.0  # loop time before which no request may start


class _Slot:
    # A class, not @asynccontextmanager: it is entered on every request.
    __slots__ = ("state",)

    def __init__(self, state: _Host) -> None:
        self.state = state

    async def __aenter__(self) -> None:
        state = self.state
        await state.in_flight.acquire()
        try:
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
        except BaseException:
            state.in_flight.release()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self.state.in_flight.release()


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
        robots_cache: RobotsCache | None = None,
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
        self.robots = robots_cache if robots_cache is not None else RobotsCache()
        self._robots_locks: dict[str, asyncio.Lock] = {}  # only while a load is under way

    def _host(self, host: str) -> _Host:
        state = self._hosts.get(host)
        if state is None:
            state = _Host(asyncio.Semaphore(self.max_in_flight), self.min_interval)
            self._hosts[host] = state
        return state

    def slot(self, host: str) -> _Slot:
        """Hold one of ``host``'s in-flight places, started no sooner than allowed.

        The request is made inside the ``async with`` block; the place is free
        again when the block ends.
        """
        return _Slot(self._host(host))

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

    async def robots_refusal(self, target: ParsedUrl, load: RobotsLoader) -> RobotsRefusal | None:
        """None if robots.txt lets us fetch ``target``, else why not.

        The origin's robots.txt is loaded once (concurrent callers wait for the
        first) and kept in :attr:`robots` (see :class:`RobotsCache`).
        """
        if not self.obey_robots:
            return None
        rules = self.robots.get(target.origin)
        if rules is None:
            rules = await self._rules(target, load)
        if rules.allows(target.url, self.agent):
            return None
        if rules.failure is not None:
            code, message = rules.failure
            return RobotsRefusal(code, message)
        return RobotsRefusal(
            "robots_disallowed", f"{rules.note} disallows {target.url} for {self.agent}"
        )

    async def _rules(self, target: ParsedUrl, load: RobotsLoader) -> RobotsRules:
        origin = target.origin
        rules = self.robots.get(origin)
        if rules is not None:
            return rules
        lock = self._robots_locks.setdefault(origin, asyncio.Lock())
        try:
            async with lock:
                rules = self.robots.get(origin)
                if rules is None:
                    answer = await load(f"{origin}/robots.txt")
                    rules = self.robots.put(origin, RobotsRules.from_response(answer))
                    delay = rules.crawl_delay(self.agent)
                    if delay:
                        state = self._host(target.host)
                        state.interval = max(state.interval, min(delay, MAX_CRAWL_DELAY))
        finally:
            if not lock.locked() and self._robots_locks.get(origin) is lock:
                del self._robots_locks[origin]
        return rules


class RobotsRefusal(NamedTuple):
    """Why a URL is not fetched for robots.txt: an error code and one line for people.

    ``code`` is ``robots_disallowed``, or the fetch error (``connect_error``,
    ``dns_error``, ``timeout`` …) that kept robots.txt, and so the host, out of reach.
    """

    code: str
    message: str
