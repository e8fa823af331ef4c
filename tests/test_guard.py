"""The SSRF guard: URL syntax, address checks, and refusals on the real fetch path."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crawler_app.fetching import guard
from crawler_app.fetching.fetcher import Fetcher, FetchSettings, fetch
from crawler_app.fetching.guard import FetchRefused, check_address, check_url, parse_url

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

PUBLIC = "93.184.215.14"


def resolver(table: Mapping[str, Sequence[str]]) -> guard.Resolver:
    def resolve(host: str, port: int) -> Sequence[str]:
        return table[host]

    return resolve


def refused_code(url: str, **kwargs: object) -> str:
    with pytest.raises(FetchRefused) as info:
        check_url(url, resolve=resolver({"example.com": [PUBLIC]}), **kwargs)  # type: ignore[arg-type]
    assert info.value.message  # always a readable sentence
    return info.value.code


# --- syntax ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("file:///etc/passwd", "bad_scheme"),
        ("gopher://example.com:70/_GET", "bad_scheme"),
        ("ftp://example.com/", "bad_scheme"),
        ("javascript:alert(1)", "bad_scheme"),
        ("example.com/page", "bad_scheme"),
        ("http://example.com\\@127.0.0.1/", "backslash"),
        ("http:\\\\127.0.0.1\\", "backslash"),
        ("http://user:pass@example.com/", "credentials"),
        ("http://example.com@127.0.0.1/", "credentials"),
        ("http://exa mple.com/", "control_char"),
        ("http://example.com/\nHost: evil", "control_char"),
        ("http://example.com/\t", "control_char"),
        ("http://example.com/\u200b", "control_char"),
        ("http://%31%32%37.0.0.1/", "encoded_host"),
        ("http://[fe80::1%25eth0]/", "encoded_host"),
        ("http://2130706433/", "odd_ipv4"),
        ("http://0177.0.0.1/", "odd_ipv4"),
        ("http://0x7f.0.0.1/", "odd_ipv4"),
        ("http://0x7f.1/", "odd_ipv4"),
        ("http://127.1/", "odd_ipv4"),
        ("http://127.0.0.1./", "odd_ipv4"),
        ("http://127.000.000.001/", "odd_ipv4"),
        ("http://256.1.1.1/", "odd_ipv4"),
        ("http:///path", "bad_host"),
        ("http:example.com", "bad_url"),
        ("http://example.com:0/", "bad_port"),
        ("http://example.com:70000/", "bad_port"),
        ("http://exa_mple..com/", "bad_host"),
    ],
)
def test_odd_urls_are_refused_with_a_code(url: str, code: str) -> None:
    assert refused_code(url) == code


def test_bad_characters_are_named_in_plain_words() -> None:
    for url, words in (
        ("http://example.com/a b", "a space"),
        ("http://example.com/a\tb", "a tab"),
        ("http://example.com/a\nb", "a line break"),
        ("http://example.com/a\x00b", "an invisible control character"),
        ("http://example.com/a\u200bb", "an invisible control character"),
    ):
        with pytest.raises(FetchRefused) as info:
            parse_url(url)
        assert words in info.value.message and "U+" not in info.value.message


def test_parse_url_normalises() -> None:
    parsed = parse_url("HTTPS://Bücher.Example:443/ä?q=1#frag")
    assert (parsed.scheme, parsed.host, parsed.port) == ("https", "xn--bcher-kva.example", 443)
    assert parsed.target == "/ä?q=1"
    assert parsed.url == "https://xn--bcher-kva.example/ä?q=1"
    assert parse_url("http://[0:0::1]:8080").url == "http://[::1]:8080/"
    assert parse_url("http://example.com:81").origin == "http://example.com:81"


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_integer_spelling_of_an_ipv4_address_is_refused(n: int) -> None:
    address = ipaddress.IPv4Address(n)
    octets = str(address).split(".")
    spellings = [
        str(n),
        hex(n),
        ".".join("0" + format(int(o), "o") for o in octets),
        ".".join(hex(int(o)) for o in octets),
        f"{octets[0]}.{int(octets[1]) * 65536 + int(octets[2]) * 256 + int(octets[3])}",
    ]
    for spelling in spellings:
        with pytest.raises(FetchRefused) as info:
            parse_url(f"http://{spelling}/")
        assert info.value.code == "odd_ipv4"
    assert parse_url(f"http://{address}/").host == str(address)


# --- addresses ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.255.254",
        "0.0.0.0",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "100.127.255.254",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "198.18.0.1",
        "::1",
        "::",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",
        "::8.8.8.8",
        "2002:7f00:1::1",
        "2002:a9fe:a9fe::",
        "64:ff9b::10.0.0.1",
        "64:ff9b::169.254.169.254",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",
        "ff02::1",
        "2001:db8::1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    with pytest.raises(FetchRefused) as info:
        check_address(address)
    assert info.value.code == "blocked_address"
    assert address in info.value.message


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::8.8.8.8"]
)
def test_public_addresses_pass(address: str) -> None:
    assert ipaddress.ip_address(check_address(address))


blocked_v4 = st.sampled_from(
    ["127.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "192.168.0.0/16"]
).flatmap(
    lambda net: st.integers(0, ipaddress.ip_network(net).num_addresses - 1).map(
        lambda i: ipaddress.ip_network(net)[i]
    )
)


@given(blocked_v4)
def test_ipv6_forms_of_blocked_ipv4_are_refused(v4: ipaddress.IPv4Address) -> None:
    n = int(v4)
    forms = [
        ipaddress.IPv6Address(0xFFFF << 32 | n),  # ::ffff:a.b.c.d
        ipaddress.IPv6Address(n),  # ::a.b.c.d
        ipaddress.IPv6Address(0x2002 << 112 | n << 80),  # 6to4
        ipaddress.IPv6Address(0x64FF9B << 96 | n),  # NAT64
    ]
    for form in forms:
        with pytest.raises(FetchRefused):
            check_address(str(form))


def test_allowlist_admits_named_networks_only() -> None:
    assert check_address("127.0.0.1", ["127.0.0.0/8"]) == "127.0.0.1"
    assert check_address("::ffff:127.0.0.1", ["127.0.0.0/8"]) == "127.0.0.1"
    assert check_address("10.1.2.3", ["10.1.0.0/16"]) == "10.1.2.3"
    with pytest.raises(FetchRefused):
        check_address("127.0.0.2", ["127.0.0.1/32"])
    with pytest.raises(FetchRefused):
        check_address("::1", ["127.0.0.0/8"])
    with pytest.raises(ValueError, match="not-a-net"):
        check_address("8.8.8.8", ["not-a-net"])


def test_any_private_address_among_the_answers_refuses_the_host() -> None:
    table = {"mixed.test": [PUBLIC, "10.0.0.7"], "public.test": [PUBLIC, "2606:4700::1111"]}
    with pytest.raises(FetchRefused) as info:
        check_url("http://mixed.test/", resolve=resolver(table))
    assert info.value.code == "blocked_address"
    assert "mixed.test" in info.value.message
    # What the agents' DNS answered is not for users to see (the intranet's layout).
    assert "10.0.0.7" not in info.value.message and "10.0." not in info.value.message
    assert "JODL_FETCH_ALLOW" in info.value.message
    target = check_url("http://public.test/", resolve=resolver(table))
    assert target.address == PUBLIC
    assert target.addresses == (PUBLIC, "2606:4700::1111")


def test_async_check_uses_the_resolver_and_bounds_its_time() -> None:
    async def slow(host: str, port: int) -> Sequence[str]:
        await asyncio.sleep(10)
        return [PUBLIC]

    async def main() -> str:
        with pytest.raises(FetchRefused) as info:
            await guard.check_url_async("http://slow.test/", resolve=slow, timeout=0.05)
        return info.value.code

    assert asyncio.run(main()) == "dns_error"


def test_localhost_resolves_to_loopback_and_is_refused() -> None:
    # The system resolver answers "localhost" from the hosts file: no traffic.
    with pytest.raises(FetchRefused) as info:
        check_url("http://localhost:8080/")
    assert info.value.code == "blocked_address"


# --- refusals on the fetch path: nothing ever reaches the network ---------------------------


def run_fetch(url: str, settings: FetchSettings) -> dict[str, object]:
    return asyncio.run(fetch(url, settings=settings))


def test_the_test_site_is_refused_without_the_allowlist(site: TestSite) -> None:
    site.set_page("/secret", "<p>internal</p>")
    result = run_fetch(site.url("/secret"), FetchSettings(per_host_interval=0))
    assert result["ok"] is False
    assert result["error"] == "refused"
    assert result["error_reason"] == "blocked_address"
    assert "loopback" in str(result["error_message"])
    assert site.requests() == []  # refused before any connection, robots.txt included


def test_the_allowlist_lets_the_test_site_through(site: TestSite) -> None:
    site.set_page("/page", "<p>hello</p>")
    settings = FetchSettings(allow_networks=("127.0.0.1/32",), per_host_interval=0)
    result = run_fetch(site.url("/page"), settings)
    assert result["ok"] is True and result["text"] == "hello"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "blocked_address"),
        ("http://10.0.0.1/", "blocked_address"),
        ("http://100.64.0.1/", "blocked_address"),
        ("http://[::1]/", "blocked_address"),
        ("http://[::ffff:169.254.169.254]/", "blocked_address"),
        ("http://[::ffff:127.0.0.2]/", "blocked_address"),
        ("http://2130706433/", "odd_ipv4"),
        ("http://0177.0.0.1/", "odd_ipv4"),
        ("file:///etc/passwd", "bad_scheme"),
        ("gopher://127.0.0.1:6379/_FLUSHALL", "bad_scheme"),
        ("http://127.0.0.1\\@example.com/", "backslash"),
    ],
)
def test_ssrf_attempts_are_refused_by_fetch(url: str, reason: str) -> None:
    # The allowlist admits only 127.0.0.1: everything here must still be refused.
    settings = FetchSettings(allow_networks=("127.0.0.1/32",), per_host_interval=0)
    result = run_fetch(url, settings)
    assert (result["ok"], result["error"], result["error_reason"]) == (False, "refused", reason)
    assert result["status"] is None


@pytest.mark.parametrize(
    "location",
    [
        "http://127.0.0.2:{port}/loot",
        "http://10.0.0.1/",
        "http://[::1]:{port}/loot",
        "http://2130706433:{port}/",
        "http://169.254.169.254/latest/meta-data/",
        "file:///etc/passwd",
        "http://127.0.0.2:{port}\\@127.0.0.1/",
    ],
)
def test_redirect_hops_are_checked_again(
    site: TestSite, make_site: Callable[..., TestSite], location: str
) -> None:
    # A second site on 127.0.0.2 plays the internal service; it must see nothing.
    internal = make_site("127.0.0.2")
    internal.set_page("/loot", "<p>secret</p>")
    site.set_redirect("/jump", location.format(port=internal.port))
    settings = FetchSettings(allow_networks=("127.0.0.1/32",), per_host_interval=0)
    result = run_fetch(site.url("/jump"), settings)
    assert result["error"] == "refused", result
    assert result["ok"] is False
    assert len(site.wait_requests("/jump")) == 1
    assert internal.requests() == []


def test_an_international_host_name_is_fetched(site: TestSite) -> None:
    # The guard keeps the IDNA form: the resolver, the Host header and the TLS name get it.
    site.set_page("/idn", "<p>umlaut</p>")

    async def resolve(host: str, port: int) -> Sequence[str]:
        assert host == "xn--bcher-kva.test"
        return ["127.0.0.1"]

    async def main() -> dict[str, object]:
        settings = FetchSettings(allow_networks=("127.0.0.1/32",), per_host_interval=0)
        async with Fetcher(settings, resolve=resolve) as fetcher:
            return await fetcher.fetch(f"http://Bücher.test:{site.port}/idn")

    result = asyncio.run(main())
    assert result["ok"] is True, result["error_message"]
    assert result["final_url"] == f"http://xn--bcher-kva.test:{site.port}/idn"
    assert site.wait_requests("/idn")[0].headers["host"] == f"xn--bcher-kva.test:{site.port}"


def test_host_names_go_to_the_checked_address_with_their_own_host_header(
    site: TestSite,
) -> None:
    site.set_page("/named", "<p>by name</p>")

    async def resolve(host: str, port: int) -> Sequence[str]:
        return {"pages.test": ["127.0.0.1"], "rebind.test": ["127.0.0.1", "10.0.0.9"]}[host]

    async def main() -> tuple[dict[str, object], dict[str, object]]:
        settings = FetchSettings(allow_networks=("127.0.0.1/32",), per_host_interval=0)
        async with Fetcher(settings, resolve=resolve) as fetcher:
            named = await fetcher.fetch(f"http://pages.test:{site.port}/named")
            rebind = await fetcher.fetch(f"http://rebind.test:{site.port}/named")
        return named, rebind

    named, rebind = asyncio.run(main())
    assert named["ok"] is True and named["text"] == "by name"
    assert named["final_url"] == f"http://pages.test:{site.port}/named"
    assert site.wait_requests("/named")[0].headers["host"] == f"pages.test:{site.port}"
    assert rebind["error"] == "refused" and "rebind.test" in str(rebind["error_message"])
    assert "10.0.0.9" not in str(rebind["error_message"])
    assert len(site.requests("/named")) == 1


# --- properties of the whole URL check (Hypothesis) ------------------------------------------

hosts = st.one_of(
    st.from_regex(
        r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,10}[a-zA-Z0-9])?(\.[a-zA-Z]{2,6}){0,2}", fullmatch=True
    ),
    st.sampled_from(["Bücher.example", "ÉXAMPLE.org", "xn--bcher-kva.example", "a_b.test"]),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda ip: f"[{ip}]"),
)
url_texts = st.builds(
    "{}://{}{}{}{}{}".format,
    st.sampled_from(["http", "https", "HTTP", "HtTpS"]),
    hosts,
    st.sampled_from(["", ":80", ":443", ":8080", ":1"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30).map(
        lambda path: "/" + path
    ),
    st.sampled_from(["", "?q=1", "?a=b&c=%20d", "?"]),
    st.sampled_from(["", "#frag", "#"]),
)


def public_everywhere(host: str, port: int) -> Sequence[str]:
    return [PUBLIC]


@given(url_texts)
def test_normalisation_is_idempotent(url: str) -> None:
    try:
        once = parse_url(url)
    except FetchRefused:
        return
    twice = parse_url(once.url)
    assert twice == once and twice.url == once.url
    # httpx, which puts an unusual request target in the form sent, must read the
    # normalised URL's host and port as we do.
    parsed = httpx.URL(once.url)
    default = 443 if once.scheme == "https" else 80
    assert (parsed.raw_host.decode(), parsed.port or default) == (once.host, once.port)


@given(st.one_of(st.text(max_size=200), url_texts, st.binary(max_size=50).map(repr)))
def test_any_text_is_parsed_or_refused_never_crashes(text: str) -> None:
    try:
        check_url(text, resolve=public_everywhere)
    except FetchRefused as exc:
        assert exc.code and exc.message and "\n" not in exc.message


def system_reading(host: str, port: int) -> Sequence[str]:
    """What a resolver built on inet_aton makes of a host: octal, hex, short and decimal
    IPv4 spellings become their address; any other name answers a public address."""
    try:
        return [socket.inet_ntoa(socket.inet_aton(host.rstrip(".")))]
    except OSError:
        return [PUBLIC]


def spellings(v4: ipaddress.IPv4Address) -> list[str]:
    n, octets = int(v4), [int(o) for o in str(v4).split(".")]
    return [
        str(v4),
        f"{v4}.",
        str(n),
        hex(n),
        hex(n).upper().replace("X", "x"),
        "0" + format(n, "o"),
        ".".join(f"0{o:o}" for o in octets),
        ".".join(hex(o) for o in octets),
        f"{octets[0]}.{octets[1] << 16 | octets[2] << 8 | octets[3]}",
        f"{octets[0]}.{octets[1]}.{octets[2] << 8 | octets[3]}",
        ".".join(f"00{o}" for o in octets),
        f"[::ffff:{v4}]",
        f"[::ffff:{n >> 16:x}:{n & 0xFFFF:x}]",
        f"[::FFFF:{v4}]",
        f"[0:0:0:0:0:ffff:{v4}]",
        f"[::{v4}]",
        f"[64:ff9b::{v4}]",
        f"[2002:{n >> 16:x}:{n & 0xFFFF:x}::1]",
        f"%31{str(v4)[1:]}",  # percent-encoded first digit
    ]


@given(blocked_v4, st.sampled_from(["http", "https"]), st.sampled_from(["", ":8080"]))
def test_a_blocked_address_stays_refused_in_any_spelling(
    v4: ipaddress.IPv4Address, scheme: str, port: str
) -> None:
    for host in spellings(v4):
        url = f"{scheme}://{host}{port}/"
        with pytest.raises(FetchRefused):
            target = check_url(url, resolve=system_reading)
            pytest.fail(f"{url} passed, to {target.address}")
