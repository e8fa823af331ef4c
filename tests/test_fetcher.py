"""The fetcher against a real local HTTP(S) site: validators, limits, redirects, politeness."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import shutil
import socket
import subprocess
import tracemalloc
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from crawler_app.fetching.fetcher import (
    RESULT_KEYS,
    USER_AGENT,
    Fetcher,
    FetchSettings,
    fetch,
    make_pool,
)
from crawler_app.fetching.text import fingerprint

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

LOOPBACK = ("127.0.0.0/8",)
FAST = FetchSettings(allow_networks=LOOPBACK, per_host_interval=0, total_timeout=10)


def settings(**changes: Any) -> FetchSettings:
    return dataclasses.replace(FAST, **changes)


def get(url: str, config: FetchSettings = FAST, **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(fetch(url, settings=config, **kwargs))


def get_many(urls: Sequence[str], config: FetchSettings) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        async with Fetcher(config) as fetcher:
            return list(await asyncio.gather(*(fetcher.fetch(u) for u in urls)))

    return asyncio.run(main())


# --- a plain fetch --------------------------------------------------------------------------


def test_fetch_returns_a_json_able_result(site: TestSite) -> None:
    site.set_page(
        "/page",
        "<html><head><title> Prices </title></head><body><p>Tea: 3 €</p>"
        "<script>track()</script></body></html>",
        headers={"ETag": '"v1"', "Last-Modified": "Tue, 01 Oct 2024 10:00:00 GMT"},
    )
    result = get(site.url("/page"))
    assert set(result) == set(RESULT_KEYS)
    assert json.loads(json.dumps(result)) == result
    assert result["ok"] is True and result["error"] is None
    assert (result["status"], result["title"], result["text"]) == (200, "Prices", "Tea: 3 €")
    assert result["fingerprint"] == fingerprint("Tea: 3 €")
    assert result["etag"] == '"v1"'
    assert result["last_modified"] == "Tue, 01 Oct 2024 10:00:00 GMT"
    assert result["content_type"] == "text/html; charset=utf-8"
    assert result["final_url"] == site.url("/page")
    assert result["size"] > 0 and result["elapsed"] >= 0
    seen = site.wait_requests("/page")[0]
    assert seen.headers["user-agent"] == USER_AGENT
    assert "if-none-match" not in seen.headers
    # The headers a plain HTTP client would send, each once, Host first.
    assert seen.header_names == (
        "Host", "Accept-Encoding", "Connection", "Accept", "User-Agent",
    )  # fmt: skip
    assert seen.headers["host"] == site.url("").split("/")[2]
    assert "gzip" in seen.headers["accept-encoding"]
    assert seen.headers["accept"].startswith("text/html")


def test_connection_refused_is_reported_not_raised() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = get(f"http://127.0.0.1:{port}/", settings(obey_robots=False))
    assert (result["ok"], result["error"], result["status"]) == (False, "connect_error", None)
    assert result["error_message"]


def test_connection_refused_is_reported_as_such_with_robots_obeyed() -> None:
    # robots.txt cannot be read when nothing listens: that is the cause to report, not a
    # robots.txt verdict ("robots.txt unreachable disallows").
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def main() -> list[dict[str, Any]]:
        async with Fetcher(FAST) as fetcher:  # obeys robots.txt
            return [await fetcher.fetch(f"http://127.0.0.1:{port}/") for _ in range(2)]

    for result in asyncio.run(main()):  # the second one from the cached failure
        assert (result["ok"], result["error"]) == (False, "connect_error")
        message = result["error_message"]
        assert "connection refused" in message and "robots" not in message
        assert "Errno" not in message


def test_an_unknown_host_is_named_in_plain_words() -> None:
    result = get("http://no-such-host.invalid/", settings(obey_robots=False))
    assert result["error"] == "dns_error"
    assert "no-such-host.invalid" in result["error_message"]
    assert "Errno" not in result["error_message"] and "-2" not in result["error_message"]


def test_a_loopback_refusal_names_the_setting_that_allows_it(site: TestSite) -> None:
    site.set_page("/p", "<p>x</p>")
    by_address = get(site.url("/p"), settings(allow_networks=()))
    by_name = get(f"http://localhost:{site.port}/p", settings(allow_networks=()))
    assert by_address["error"] == by_name["error"] == "refused"
    assert "JODL_FETCH_ALLOW=127.0.0.0/8" in by_address["error_message"]
    assert "JODL_FETCH_ALLOW" in by_name["error_message"]
    # A name's refusal says nothing of what it resolved to, and reads as a sentence.
    assert "127.0.0.1" not in by_name["error_message"].split("/p: ", 1)[1]
    assert "resolves to" not in by_name["error_message"]
    assert "localhost is a private or loopback address" in by_name["error_message"]
    assert site.requests("/p") == []


# --- conditional GET ------------------------------------------------------------------------


def test_stored_validators_are_sent_back_exactly_and_304_reads_no_body(site: TestSite) -> None:
    etag, modified = 'W/"abc-123"', "Wed, 02 Oct 2024 08:30:00 GMT"
    site.set_page("/c", "<p>same</p>", headers={"ETag": etag, "Last-Modified": modified})
    first = get(site.url("/c"))
    second = get(site.url("/c"), etag=first["etag"], last_modified=first["last_modified"])
    assert second["ok"] is True and second["not_modified"] is True
    assert second["status"] == 304
    assert (second["etag"], second["last_modified"]) == (etag, modified)
    assert second["text"] is None and second["fingerprint"] is None and second["size"] == 0
    log = site.wait_requests("/c", 2)
    assert log[1].headers["if-none-match"] == etag
    assert log[1].headers["if-modified-since"] == modified
    assert (log[1].status, log[1].body_sent) == (304, False)
    assert log[0].body_sent is True


def test_last_modified_alone_makes_a_conditional_get(site: TestSite) -> None:
    modified = "Wed, 02 Oct 2024 08:30:00 GMT"
    site.set_page("/lm", "<p>x</p>", headers={"Last-Modified": modified})
    result = get(site.url("/lm"), last_modified=modified)
    assert result["not_modified"] is True
    assert site.wait_requests("/lm")[0].body_sent is False


def test_a_changed_page_answers_with_its_new_body(site: TestSite) -> None:
    site.set_page("/v", "<p>version two</p>", headers={"ETag": '"v2"'})
    result = get(site.url("/v"), etag='"v1"')
    assert result["not_modified"] is False
    assert (result["text"], result["etag"]) == ("version two", '"v2"')


# --- limits ---------------------------------------------------------------------------------


def test_bodies_over_the_size_limit_are_cut_off(site: TestSite) -> None:
    huge = 50 * 1024 * 1024
    site.set_page("/huge", size=huge, send_length=False)
    result = get(site.url("/huge"), settings(max_bytes=100_000))
    assert (result["ok"], result["error"], result["status"]) == (False, "too_large", 200)
    assert site.wait_requests("/huge")[0].bytes_sent < huge  # the client stopped reading


def test_a_declared_length_over_the_limit_is_refused_unread(site: TestSite) -> None:
    site.set_page("/big", size=2_000_000)
    result = get(site.url("/big"), settings(max_bytes=1000))
    assert result["error"] == "too_large"


def test_compressed_bodies_count_after_decompression(site: TestSite) -> None:
    bomb = gzip.compress(b"<p>" + b"0" * 5_000_000 + b"</p>")
    site.set_page("/bomb", bomb, headers={"Content-Encoding": "gzip"})
    assert get(site.url("/bomb"), settings(max_bytes=100_000))["error"] == "too_large"
    small = gzip.compress(b"<p>zipped</p>")
    site.set_page("/small", small, headers={"Content-Encoding": "gzip"})
    assert get(site.url("/small"))["text"] == "zipped"


def compress(data_size: int, coding: str) -> bytes:
    """``data_size`` zero bytes compressed with ``coding``, built without holding them."""
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "raw": -zlib.MAX_WBITS}
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits[coding])
    block = b"\0" * (1 << 20)
    parts = [packer.compress(b"<p>")]
    parts += [packer.compress(block) for _ in range(data_size >> 20)]
    return b"".join([*parts, packer.compress(b"</p>"), packer.flush()])


def peak_memory_of(url: str, config: FetchSettings) -> tuple[dict[str, Any], int]:
    tracemalloc.start()
    try:
        result = get(url, config)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("coding", "header"),
    [("gzip", "gzip"), ("deflate", "deflate"), ("raw", "deflate"), ("gzip2", "gzip, gzip")],
)
def test_a_compression_bomb_stops_at_the_limit_in_bounded_memory(
    site: TestSite, coding: str, header: str
) -> None:
    if coding == "gzip2":  # 256 MB inside two layers of gzip: a few kilobytes on the wire
        body = gzip.compress(compress(256 << 20, "gzip"), 9)
    else:
        body = compress(64 << 20, coding)
    assert len(body) < 300_000
    site.set_page("/bomb", body, headers={"Content-Encoding": header})
    limit = 1 << 20
    result, peak = peak_memory_of(site.url("/bomb"), settings(max_bytes=limit, obey_robots=False))
    assert result["error"] == "too_large"
    assert "1048576 bytes" in result["error_message"]
    # The limit, a few decompression steps and the fetcher's own needs: far below the
    # 64 MB (or 256 MB) the body decodes to.
    assert peak < 16 * limit


def test_compressed_bodies_under_the_limit_decode_in_any_supported_coding(site: TestSite) -> None:
    page = b"<p>" + b"zipped " * 50_000 + b"</p>"  # 350 kB: many decompression steps
    codings = {
        "gzip": gzip.compress(page),
        "x-gzip": gzip.compress(page),
        "deflate": zlib.compress(page),
        "gzip, deflate": zlib.compress(gzip.compress(page)),
        "identity": page,
    }
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    codings["deflate "] = raw.compress(page) + raw.flush()  # raw deflate, as some servers send
    for n, (coding, body) in enumerate(codings.items()):
        site.set_page(f"/z{n}", body, headers={"Content-Encoding": coding.strip()})
    results = get_many([site.url(f"/z{n}") for n in range(len(codings))], FAST)
    for coding, result in zip(codings, results, strict=True):
        assert result["ok"], (coding, result["error_message"])
        assert result["size"] == len(page) and result["text"].startswith("zipped zipped")
    assert "gzip" in site.requests("/z0")[0].headers["accept-encoding"]


def test_a_broken_compressed_body_is_a_protocol_error(site: TestSite) -> None:
    site.set_page("/broken", b"not gzip at all", headers={"Content-Encoding": "gzip"})
    result = get(site.url("/broken"), settings(obey_robots=False))
    assert result["error"] == "protocol_error" and "gzip" in result["error_message"]


def test_slow_server_hits_the_read_timeout(site: TestSite) -> None:
    site.set_page("/slow", "<p>late</p>", delay=5)
    result = get(site.url("/slow"), settings(read_timeout=0.2, obey_robots=False))
    assert (result["ok"], result["error"]) == (False, "timeout")
    assert result["elapsed"] < 4


def test_a_dripping_body_hits_the_total_timeout(site: TestSite) -> None:
    # Every chunk arrives within the read timeout; the whole takes too long.
    site.set_page("/drip", b"<p>" + b"x" * 200_000 + b"</p>", drip=0.15)
    result = get(site.url("/drip"), settings(read_timeout=5, total_timeout=0.5))
    assert result["error"] == "timeout"
    assert "total" in result["error_message"]


def test_only_text_content_types_are_read(site: TestSite) -> None:
    site.set_page("/img", b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, content_type="image/png")
    site.set_page("/bin", b"\x00\x01\x02", content_type=None)
    for path in ("/img", "/bin"):
        result = get(site.url(path))
        assert (result["ok"], result["error"]) == (False, "bad_content_type"), path
    site.set_page("/plain", "hello   plain\n\n text", content_type="text/plain")
    assert get(site.url("/plain"))["text"] == "hello plain\ntext"


def test_http_errors_carry_the_status(site: TestSite) -> None:
    site.set_page("/gone", "<p>gone</p>", status=410)
    result = get(site.url("/gone"))
    assert (result["ok"], result["error"], result["status"]) == (False, "http_error", 410)
    assert get(site.url("/missing"))["status"] == 404


# --- redirects ------------------------------------------------------------------------------


def test_redirects_are_followed_and_reported(site: TestSite) -> None:
    site.set_redirect("/old", "/mid", status=301)
    site.set_redirect("/mid", site.url("/new"), status=307)
    site.set_page("/new", "<p>moved here</p>")
    result = get(site.url("/old"))
    assert result["ok"] is True and result["text"] == "moved here"
    assert result["final_url"] == site.url("/new")
    assert result["redirects"] == [site.url("/mid"), site.url("/new")]


def test_redirect_limit(site: TestSite) -> None:
    for i in range(10):
        site.set_redirect(f"/r{i}", f"/r{i + 1}")
    result = get(site.url("/r0"), settings(max_redirects=3))
    assert (result["ok"], result["error"]) == (False, "too_many_redirects")
    site.wait_requests("/r3")
    hops = [r.path for r in site.requests() if r.path != "/robots.txt"]
    assert hops == ["/r0", "/r1", "/r2", "/r3"]


@pytest.mark.parametrize(
    "location", ["http:\\\\evil.example/", "https:\\\\evil.example/x", "\\\\evil.example/", "/a\\b"]
)
def test_a_backslash_in_a_redirect_is_a_clean_refusal(site: TestSite, location: str) -> None:
    """Issue 20: never ``internal_error: InvalidURL`` (whichever parser sees it first)."""
    site.set_redirect("/go", location)
    result = get(site.url("/go"))
    assert (result["ok"], result["error"]) == (False, "refused")
    assert result["error_reason"] in ("backslash", "bad_url")
    assert "\n" not in result["error_message"]
    # robots.txt redirected so counts as missing (all allowed), as a refused target does.
    site.set_redirect("/robots.txt", location)
    site.set_page("/page", "<p>here</p>")
    assert get(site.url("/page"))["ok"] is True


def test_redirect_loop_ends(site: TestSite) -> None:
    site.set_redirect("/ping", "/pong")
    site.set_redirect("/pong", "/ping")
    assert get(site.url("/ping"))["error"] == "too_many_redirects"


# --- text options ---------------------------------------------------------------------------


def test_selector_restricts_the_text(site: TestSite) -> None:
    site.set_page("/s", "<div id=ad>Buy now 12:01</div><main><p>Article</p></main>")
    result = get(site.url("/s"), selector="main")
    assert (result["text"], result["selector_matches"]) == ("Article", 1)


def test_a_bad_selector_fails_before_any_request(site: TestSite) -> None:
    site.set_page("/s", "<p>x</p>")
    result = get(site.url("/s"), selector="div[")
    assert (result["ok"], result["error"]) == (False, "bad_selector")
    assert site.requests() == []


def test_json_and_long_texts(site: TestSite) -> None:
    site.set_page("/j", '{"b": 2, "a": 1}', content_type="application/json")
    site.set_page("/k", '{"a": 1, "b": 2}', content_type="application/json")
    assert get(site.url("/j"))["fingerprint"] == get(site.url("/k"))["fingerprint"]
    site.set_page("/long", "<p>" + "word " * 1000 + "</p>")
    result = get(site.url("/long"), settings(max_text_chars=100))
    assert result["truncated"] is True and len(result["text"]) <= 100
    assert result["fingerprint"] == fingerprint(result["text"])


# --- the guarded connection path ------------------------------------------------------------


def test_only_guarded_pools_are_accepted() -> None:
    async def main() -> dict[str, Any]:
        async with httpx.AsyncClient() as plain:
            return await fetch("http://127.0.0.1/", settings=FAST, pool=plain)  # type: ignore[arg-type]

    result = asyncio.run(main())
    assert result["ok"] is False and "make_pool" in result["error_message"]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Self-signed certificates for pages.test and other.test (made with openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    folder = tmp_path_factory.mktemp("tls")
    made: dict[str, tuple[str, str]] = {}
    for name in ("pages.test", "other.test"):
        cert, key = folder / f"{name}.crt", folder / f"{name}.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
             "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        made[name] = (str(cert), str(key))
    return made


def test_https_keeps_host_name_for_sni_and_certificate(
    make_site: Callable[..., TestSite], certificates: dict[str, tuple[str, str]]
) -> None:
    good = make_site(tls=certificates["pages.test"])
    bad = make_site(tls=certificates["other.test"])
    for tls_site in (good, bad):
        tls_site.set_page("/secure", "<p>over tls</p>")

    async def resolve(host: str, port: int) -> Sequence[str]:
        return ["127.0.0.1"]

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        config = settings(ca_file=certificates["pages.test"][0], obey_robots=False)
        async with Fetcher(config, resolve=resolve) as fetcher:
            ok = await fetcher.fetch(f"https://pages.test:{good.port}/secure")
            wrong = await fetcher.fetch(f"https://pages.test:{bad.port}/secure")
        return ok, wrong

    ok, wrong = asyncio.run(main())
    assert ok["ok"] is True and ok["text"] == "over tls"
    seen = good.wait_requests("/secure")[0]
    assert seen.sni == "pages.test"
    assert seen.headers["host"] == f"pages.test:{good.port}"
    # The other site's certificate is not for pages.test: refused during the handshake.
    assert wrong["error"] == "connect_error" and "CERTIFICATE" in wrong["error_message"].upper()
    assert bad.requests() == []


# --- politeness -----------------------------------------------------------------------------


def test_many_fetches_are_in_flight_at_once(site: TestSite) -> None:
    for i in range(10):
        site.set_page(f"/p{i}", f"<p>{i}</p>", delay=0.4)
    results = get_many([site.url(f"/p{i}") for i in range(10)], settings(per_host_in_flight=10))
    assert [r["text"] for r in results] == [str(i) for i in range(10)]
    pages = [r for r in site.wait_requests(None, 11) if r.path.startswith("/p")]
    assert site.max_overlap(pages) == 10


def test_requests_to_one_host_are_spaced(site: TestSite) -> None:
    for i in range(4):
        site.set_page(f"/p{i}", f"<p>{i}</p>")
    results = get_many([site.url(f"/p{i}") for i in range(4)], settings(per_host_interval=0.25))
    assert all(r["ok"] for r in results)
    starts = [r.started for r in site.wait_requests(None, 5)]  # robots.txt and four pages
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
    assert len(gaps) == 4 and min(gaps) >= 0.2, gaps


def test_in_flight_limit_per_host_but_not_across_hosts(
    site: TestSite, make_site: Callable[..., TestSite]
) -> None:
    second = make_site("127.0.0.2")
    for host_site in (site, second):
        for i in range(4):
            host_site.set_page(f"/p{i}", f"<p>{i}</p>", delay=0.3)
    urls = [s.url(f"/p{i}") for s in (site, second) for i in range(4)]
    results = get_many(urls, settings(per_host_in_flight=2))
    assert all(r["ok"] for r in results)
    first_pages = [r for r in site.wait_requests(None, 5) if r.path.startswith("/p")]
    second_pages = [r for r in second.wait_requests(None, 5) if r.path.startswith("/p")]
    assert site.max_overlap(first_pages) == 2
    assert site.max_overlap(second_pages) == 2
    assert site.max_overlap(first_pages + second_pages) >= 3  # the two hosts ran side by side


def test_retry_after_pauses_the_host(site: TestSite) -> None:
    site.set_page("/busy", "<p>busy</p>", status=503, headers={"Retry-After": "1"})
    site.set_page("/capped", "<p>busy</p>", status=429, headers={"Retry-After": "3600"})
    site.set_page("/next", "<p>next</p>")

    async def main() -> list[dict[str, Any]]:
        async with Fetcher(settings(max_retry_after=0.5)) as fetcher:
            busy = await fetcher.fetch(site.url("/busy"))
            after_busy = await fetcher.fetch(site.url("/next"))
            capped = await fetcher.fetch(site.url("/capped"))
            after_capped = await fetcher.fetch(site.url("/next"))
        return [busy, after_busy, capped, after_capped]

    busy, after_busy, capped, after_capped = asyncio.run(main())
    assert (busy["error"], busy["status"], capped["status"]) == ("http_error", 503, 429)
    assert after_busy["ok"] and after_capped["ok"]
    nexts = site.wait_requests("/next", 2)
    assert nexts[0].started - site.requests("/busy")[0].finished >= 0.4  # paused (capped 0.5)
    assert nexts[1].started - site.requests("/capped")[0].finished >= 0.4  # capped, not 3600


# --- robots.txt -----------------------------------------------------------------------------


def test_robots_txt_is_honoured_and_read_once(site: TestSite) -> None:
    site.set_robots("User-agent: *\nDisallow: /private\n")
    site.set_page("/private/report", "<p>no</p>")
    site.set_page("/public", "<p>yes</p>")
    urls = [site.url("/private/report"), site.url("/public"), site.url("/public")]
    private, public, again = get_many(urls, FAST)
    assert (private["ok"], private["error"]) == (False, "robots_disallowed")
    assert "/private/report" in private["error_message"]
    assert public["ok"] and again["ok"]
    site.wait_requests("/public", 2)
    assert len(site.requests("/robots.txt")) == 1
    assert site.requests("/private/report") == []


def test_robots_groups_for_our_agent_apply(site: TestSite) -> None:
    site.set_robots("User-agent: JODL-PageChecker\nDisallow: /\n\nUser-agent: *\nAllow: /\n")
    site.set_page("/any", "<p>x</p>")
    assert get(site.url("/any"))["error"] == "robots_disallowed"
    assert get(site.url("/any"), settings(obey_robots=False))["ok"] is True


def test_an_unreachable_robots_txt_disallows_everything(site: TestSite) -> None:
    site.set_page("/robots.txt", "oops", status=503)
    site.set_page("/page", "<p>x</p>")
    result = get(site.url("/page"))
    assert result["error"] == "robots_disallowed"
    assert "robots.txt answered 503" in result["error_message"]
    assert site.requests("/page") == []


def test_a_missing_robots_txt_allows_everything(site: TestSite) -> None:
    site.set_page("/page", "<p>x</p>")
    assert get(site.url("/page"))["ok"] is True
    assert site.wait_requests("/robots.txt")[0].status == 404


def test_robots_crawl_delay_spaces_requests(site: TestSite) -> None:
    site.set_robots("User-agent: *\nCrawl-delay: 1\n")
    site.set_page("/a", "<p>a</p>")
    site.set_page("/b", "<p>b</p>")

    async def main() -> None:
        async with Fetcher(FAST) as fetcher:
            await fetcher.fetch(site.url("/a"))
            await fetcher.fetch(site.url("/b"))
            assert fetcher.politeness.interval("127.0.0.1") == 1.0

    asyncio.run(main())
    a, b = site.wait_requests("/a")[0], site.wait_requests("/b")[0]
    assert b.started - a.started >= 0.8


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        FetchSettings(max_bytes=0)
    with pytest.raises(ValueError, match="nonsense"):
        FetchSettings(allow_networks=("nonsense",))


def test_the_whole_path_runs_inside_a_running_loop_with_own_pool(site: TestSite) -> None:
    site.set_page("/p", "<p>shared</p>")

    async def main() -> list[dict[str, Any]]:
        async with make_pool(FAST) as pool:
            return [await fetch(site.url("/p"), settings=FAST, pool=pool) for _ in range(2)]

    assert [r["text"] for r in asyncio.run(main())] == ["shared", "shared"]
