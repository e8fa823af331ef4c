"""The robots.txt cache: a byte budget, a lifetime per answer, failures kept briefly.

Time is moved by a settable clock given to the cache; robots.txt comes from the
real local site through the fetcher's guarded path.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from crawler_app.fetching.fetcher import Fetcher, FetchSettings
from crawler_app.fetching.politeness import (
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


# --- RFC 9309's own examples, served by the local site and read through the fetcher ---------


def verdicts(site: TestSite, robots: str, agent: str, paths: list[str]) -> dict[str, bool]:
    """Which of ``paths`` the fetcher, calling itself ``agent``, fetches under ``robots``."""
    site.set_robots(robots)
    for path in paths:
        site.set_page(path, "<p>x</p>")
    config = dataclasses.replace(FAST, user_agent=f"{agent}/1.0 (test)")
    results = fetch_in_turn(RobotsCache(), [site.url(p) for p in paths], config)
    for result in results:
        assert result["ok"] or result["error"] == "robots_disallowed", result
    allowed = {p: bool(r["ok"]) for p, r in zip(paths, results, strict=True)}
    fetched = {r.path for r in site.requests() if r.path != "/robots.txt"}
    assert {p for p, ok in allowed.items() if ok} == fetched  # refused URLs are never asked
    site.clear_log()
    return allowed


# RFC 9309, 5.1 (its closing "EOF" line included).
RFC_5_1 = """\
User-Agent: *
Disallow: *.gif$
Disallow: /example/
Allow: /publications/

User-Agent: foobot
Disallow:/
Allow:/example/page.html
Allow:/example/allowed.gif

User-Agent: barbot
User-Agent: bazbot
Disallow: /example/page.html

User-Agent: quxbot

EOF
"""


def test_rfc9309_simple_example_groups_per_agent(site: TestSite) -> None:
    paths = ["/example/page.html", "/example/allowed.gif", "/img/a.gif", "/publications/x",
             "/other"]  # fmt: skip
    assert verdicts(site, RFC_5_1, "otherbot", paths) == {
        "/example/page.html": False, "/example/allowed.gif": False, "/img/a.gif": False,
        "/publications/x": True, "/other": True,
    }  # fmt: skip
    assert verdicts(site, RFC_5_1, "foobot", paths) == {
        "/example/page.html": True, "/example/allowed.gif": True, "/img/a.gif": False,
        "/publications/x": False, "/other": False,
    }  # fmt: skip
    for agent in ("barbot", "bazbot"):  # one group, two user-agent lines; no fallback to *
        assert verdicts(site, RFC_5_1, agent, paths) == {
            "/example/page.html": False, "/example/allowed.gif": True, "/img/a.gif": True,
            "/publications/x": True, "/other": True,
        }  # fmt: skip
    assert set(verdicts(site, RFC_5_1, "quxbot", paths).values()) == {True}  # empty group


def test_rfc9309_longest_match_wins(site: TestSite) -> None:
    # RFC 9309, 5.2.
    robots = "User-Agent: foobot\nAllow: /example/page/\nDisallow: /example/page/disallowed.gif\n"
    paths = ["/example/page/", "/example/page/other.gif", "/example/page/disallowed.gif"]
    assert verdicts(site, robots, "foobot", paths) == {
        "/example/page/": True, "/example/page/other.gif": True,
        "/example/page/disallowed.gif": False,
    }  # fmt: skip


def test_rfc9309_special_characters(site: TestSite) -> None:
    # RFC 9309, 2.2.3: "*" any sequence, "$" the end of the pattern, "#" a comment.
    robots = (
        "User-Agent: *\nDisallow: /\n"
        "Allow: /this/*/exactly\n"
        "Allow: /this/path/exactly$\n"
        "Disallow: /this/path/exactly/ # a comment is not part of the rule\n"
    )
    paths = ["/this/a/b/exactly", "/this/path/exactly", "/this/path/exactly/", "/that"]
    assert verdicts(site, robots, "JODL-PageChecker", paths) == {
        "/this/a/b/exactly": True, "/this/path/exactly": True,
        "/this/path/exactly/": False, "/that": False,
    }  # fmt: skip


def test_rfc9309_an_equivalent_allow_wins_and_wildcards_end_anchors(site: TestSite) -> None:
    # RFC 9309, 2.2.2: of an equivalent allow and disallow rule, allow is used.
    robots = (
        "User-agent: *\nDisallow: /*.json$\nDisallow: /priv/\nAllow: /priv/ok.html\n"
        "Disallow: /same\nAllow: /same\n"
    )
    paths = ["/data.json", "/data.json.html", "/priv/ok.html", "/priv/secret.html", "/same"]
    assert verdicts(site, robots, "JODL-PageChecker", paths) == {
        "/data.json": False, "/data.json.html": True, "/priv/ok.html": True,
        "/priv/secret.html": False, "/same": True,
    }  # fmt: skip


def test_rfc9309_groups_of_one_agent_are_combined(site: TestSite) -> None:
    # RFC 9309, 2.2.1: several groups for one product token count as one.
    robots = (
        "user-agent: ExampleBot\ndisallow: /foo\ndisallow: /bar\n\n"
        "user-agent: ExampleBot\ndisallow: /baz\n"
    )
    paths = ["/foo", "/bar", "/baz", "/qux"]
    assert verdicts(site, robots, "ExampleBot", paths) == {
        "/foo": False, "/bar": False, "/baz": False, "/qux": True,
    }  # fmt: skip
