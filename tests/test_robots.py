"""The robots.txt cache: a byte budget, a lifetime per answer, failures kept briefly.

Time is moved by a settable clock given to the cache; robots.txt comes from the
real local site through the fetcher's guarded path.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from crawler_app.fetcher import Fetcher, FetchSettings
from crawler_app.politeness import (
    ROBOTS_TTL,
    Politeness,
    RobotsAnswer,
    RobotsCache,
    RobotsRules,
)

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

FAST = FetchSettings(allow_networks=("127.0.0.0/8",), per_host_interval=0, total_timeout=10)


class Seconds:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fetch_in_turn(cache: RobotsCache, steps: list[Any], config: FetchSettings = FAST) -> list[Any]:
    """Run ``steps`` in order with one fetcher: a URL is fetched, a callable is called."""

    async def main() -> list[Any]:
        politeness = Politeness(min_interval=0, user_agent=config.user_agent, robots_cache=cache)
        results = []
        async with Fetcher(config, politeness=politeness) as fetcher:
            for step in steps:
                results.append(await fetcher.fetch(step) if isinstance(step, str) else step())
        return results

    return asyncio.run(main())


def test_a_transient_robots_failure_is_forgotten_after_the_failure_ttl(site: TestSite) -> None:
    clock = Seconds()
    cache = RobotsCache(failure_ttl=300, clock=clock)
    site.set_page("/robots.txt", "down", status=503)
    site.set_page("/page", "<p>x</p>")

    def recover() -> None:
        site.set_robots("User-agent: *\nAllow: /\n")

    def later(seconds: float) -> Any:
        return lambda: setattr(clock, "now", clock.now + seconds)

    page = site.url("/page")
    first, _, again, _, third = fetch_in_turn(cache, [page, recover, page, later(301), page])
    assert first["error"] == "robots_disallowed" and "503" in first["error_message"]
    assert again["error"] == "robots_disallowed"  # kept for a while: the host is not hammered
    assert third["ok"] is True  # then asked again
    assert len(site.requests("/robots.txt")) == 2


def test_robots_txt_is_fetched_again_after_a_day(site: TestSite) -> None:
    clock = Seconds()
    cache = RobotsCache(clock=clock)
    site.set_robots("User-agent: *\nAllow: /\n")
    site.set_page("/page", "<p>x</p>")
    page = site.url("/page")

    def close_the_site() -> None:
        site.set_robots("User-agent: *\nDisallow: /\n")

    def later(seconds: float) -> Any:
        return lambda: setattr(clock, "now", clock.now + seconds)

    results = fetch_in_turn(
        cache, [page, close_the_site, later(ROBOTS_TTL - 60), page, later(120), page]
    )
    assert results[0]["ok"] and results[3]["ok"]  # the day-old answer still holds
    assert results[5]["error"] == "robots_disallowed"
    assert len(site.requests("/robots.txt")) == 2


def test_a_failed_refetch_keeps_the_last_good_robots_txt_briefly(site: TestSite) -> None:
    clock = Seconds()
    cache = RobotsCache(failure_ttl=300, clock=clock)
    site.set_robots("User-agent: *\nDisallow: /private\n")
    site.set_page("/page", "<p>x</p>")
    site.set_page("/private", "<p>no</p>")

    def break_robots() -> None:
        site.set_page("/robots.txt", "down", status=503)

    def later(seconds: float) -> Any:
        return lambda: setattr(clock, "now", clock.now + seconds)

    steps = [site.url("/page"), break_robots, later(ROBOTS_TTL + 1), site.url("/page")]
    steps += [site.url("/private"), later(301), site.url("/page")]
    results = fetch_in_turn(cache, steps)
    # RFC 9309, 2.4: while robots.txt is unreachable, the cached copy may serve on.
    assert results[3]["ok"] is True
    assert results[4]["error"] == "robots_disallowed"
    assert len(site.requests("/robots.txt")) == 3  # and it is asked again after a while


def rules(size: int) -> RobotsRules:
    return RobotsRules.from_response(
        RobotsAnswer(200, "User-agent: *\nDisallow: /x\n" + "#" * size)
    )


def test_the_cache_stays_within_its_byte_budget_dropping_the_least_recently_used() -> None:
    clock = Seconds()
    one = rules(10_000)
    cache = RobotsCache(budget=3 * one.cost, clock=clock)
    for n in range(3):
        cache.put(f"http://site{n}.test", rules(10_000))
    assert cache.get("http://site0.test") is not None  # site0 now used most recently
    cache.put("http://site3.test", rules(10_000))
    assert len(cache) == 3 and cache.size <= cache.budget
    assert cache.get("http://site1.test") is None  # the least recently used went
    assert cache.get("http://site0.test") is not None
    for n in range(100):
        cache.put(f"http://many{n}.test", rules(10_000))
    assert cache.size <= cache.budget and len(cache) == 3


def test_rules_larger_than_the_budget_are_used_but_not_kept() -> None:
    cache = RobotsCache(budget=100_000, clock=Seconds())
    huge = rules(512 * 1024)
    assert cache.put("http://huge.test", huge) is huge
    assert len(cache) == 0 and cache.size == 0


def test_the_cost_of_big_robots_files_is_counted() -> None:
    # About 6 MB of parsed rules for a 512 KiB robots.txt: the estimate must not be far off.
    assert rules(512 * 1024).cost >= 5 * 1024 * 1024


def test_the_robots_settings_reach_the_cache(site: TestSite) -> None:
    config = dataclasses.replace(
        FAST, robots_cache_bytes=12345, robots_ttl=60, robots_failure_ttl=0
    )

    async def main() -> RobotsCache:
        async with Fetcher(config) as fetcher:
            return fetcher.politeness.robots

    cache = asyncio.run(main())
    assert (cache.budget, cache.ttl, cache.failure_ttl) == (12345, 60, 0)
