"""SSRF guard: the one check every fetch of the page checker goes through.

A URL given by a user may point anywhere: at the cloud metadata service
(169.254.169.254), at a database on the private network, at the checker's own
loopback services. The guard refuses all of that *before* any connection:

1. **Syntax** (:func:`parse_url`): only ``http`` and ``https``; no backslashes,
   control characters or whitespace; no credentials (``user:pass@``); no
   percent-encoded host; an IPv4 literal must be the canonical dotted quad —
   decimal (``2130706433``), octal (``0177.0.0.1``), hex (``0x7f.1``) and short
   (``127.1``) forms are refused, because resolvers and parsers disagree about
   them.
2. **Addresses** (:func:`check_address`): the host is resolved once and refused
   if *any* address is loopback, private, link-local, shared (CGNAT 100.64/10),
   multicast, unspecified, reserved or documentation space, or an IPv6 form
   that embeds such an IPv4 address (IPv4-mapped ``::ffff:``, IPv4-compatible,
   6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``, Teredo). Networks named in an
   allowlist (e.g. ``127.0.0.0/8`` for tests, an intranet range) are admitted.
3. **Pinning**: the result, a :class:`CheckedTarget`, carries the address that
   was checked; the fetcher connects to exactly that address (keeping the
   original host name for the ``Host`` header and TLS server name), so a DNS
   answer that changes between the check and the connection cannot redirect the
   fetch.

Every refusal is a :class:`FetchRefused` with a short machine code and a clear
message.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

import idna

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Schemes a page may be fetched with.
ALLOWED_SCHEMES = ("http", "https")

#: Longest URL accepted (browsers and servers commonly stop near 8 KiB).
MAX_URL_LENGTH = 8192

#: The setting (environment variable) that admits non-public networks, named in refusals.
ALLOW_SETTING = "JODL_FETCH_ALLOW"

#: A resolver takes (host, port) and returns the host's addresses as strings.
Resolver = Callable[[str, int], Sequence[str]]
AsyncResolver = Callable[[str, int], Awaitable[Sequence[str]]]


class FetchRefused(Exception):
    """A URL or address the guard will not fetch.

    ``code`` is a short machine-readable reason (``bad_scheme``, ``credentials``,
    ``odd_ipv4``, ``blocked_address``, ``dns_error`` …); ``message`` says what was
    refused and why, in one line.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ParsedUrl:
    """A URL that passed the syntax checks, split into the parts a fetch needs.

    ``host`` is lower-case ASCII (IDNA-encoded; an IPv6 literal without brackets,
    in compressed form); ``target`` is the path plus query (never empty); the
    fragment is dropped.
    """

    scheme: str
    host: str
    port: int
    target: str

    @property
    def is_ip_literal(self) -> bool:
        """True when the host is an IP address rather than a name."""
        return _ip_or_none(self.host) is not None

    @property
    def netloc(self) -> str:
        """Host (bracketed if IPv6) plus the port when it is not the default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The normalised URL: what is fetched and reported."""
        return f"{self.scheme}://{self.netloc}{self.target}"

    @property
    def origin(self) -> str:
        """``scheme://host[:port]``: the key for robots.txt."""
        return f"{self.scheme}://{self.netloc}"


@dataclass(frozen=True)
class CheckedTarget(ParsedUrl):
    """A URL whose host resolved only to admitted addresses.

    ``address`` is the checked address to connect to; ``addresses`` all the
    addresses the host resolved to (all of them were checked).
    """

    address: str = ""
    addresses: tuple[str, ...] = ()


# --- syntax ---------------------------------------------------------------------------------

_HOST_CHARS = re.compile(r"^[a-z0-9_.-]+$")
_DIGITS = re.compile(r"^[0-9]+$")
_HEXISH = re.compile(r"^0[xX][0-9a-fA-F]*$")
_ASCII_BAD = re.compile(r"[\x00-\x20\x7f]")


def _bad_char(url: str) -> str | None:
    """The first control, format or whitespace character in ``url``, if any."""
    if url.isascii():  # the only such ASCII characters: controls, DEL and the space
        found = _ASCII_BAD.search(url)
        return found.group() if found else None
    for ch in url:
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Zs"):
            return ch
    return None


_CHAR_NAMES = {" ": "a space", "\t": "a tab", "\n": "a line break", "\r": "a line break"}


def _char_name(ch: str) -> str:
    """``ch`` in plain words, for people: "a space", "a tab", "an invisible character"."""
    if ch in _CHAR_NAMES:
        return _CHAR_NAMES[ch]
    return "a space" if ch.isspace() else "an invisible control character"


def parse_url(url: str) -> ParsedUrl:
    """Check the syntax of ``url`` and split it; no DNS, no network.

    Raises :class:`FetchRefused` for anything but a plain ``http``/``https`` URL
    with an unambiguous host.
    """
    if not isinstance(url, str):
        raise FetchRefused("bad_url", f"URL must be a string, not {type(url).__name__}")
    if not url:
        raise FetchRefused("bad_url", "URL is empty")
    if len(url) > MAX_URL_LENGTH:
        raise FetchRefused("bad_url", f"URL is longer than {MAX_URL_LENGTH} characters")
    bad = _bad_char(url)
    if bad is not None:
        raise FetchRefused("control_char", f"URL contains {_char_name(bad)}; remove it")
    if "\\" in url:
        # WHATWG parsers read "\" as "/", Python's parser does not: a classic
        # way to make two parsers see two different hosts.
        raise FetchRefused("backslash", "URL contains a backslash")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise FetchRefused("bad_url", f"URL cannot be parsed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        shown = scheme or "(none)"
        raise FetchRefused("bad_scheme", f"scheme {shown!r} is not allowed; use http or https")
    if not url[len(parts.scheme) :].startswith("://"):
        raise FetchRefused("bad_url", "URL must have the form scheme://host/path")
    if "@" in parts.netloc:
        raise FetchRefused("credentials", "URLs with credentials (user:password@) are refused")
    host, port = _checked_netloc(parts.netloc, scheme)
    target = parts.path or "/"
    if not target.startswith("/"):
        raise FetchRefused("bad_url", "URL path must start with '/'")
    if parts.query:
        target = f"{target}?{parts.query}"
    return ParsedUrl(scheme=scheme, host=host, port=port, target=target)


@functools.lru_cache(maxsize=4096)
def _checked_netloc(netloc: str, scheme: str) -> tuple[str, int]:
    """The checked host and port of ``netloc``. Cached: a site's pages share their host
    and port (refusals raise, and are not cached)."""
    parts = SplitResult(scheme, netloc, "", "", "")
    return _checked_host(netloc, parts.hostname or ""), _check_port(parts, scheme)


def _checked_host(netloc: str, host: str) -> str:
    if "%" in netloc:
        raise FetchRefused("encoded_host", "percent-encoded host names are refused")
    if netloc.startswith("["):
        literal = netloc[1:].split("]", 1)[0]
        try:
            return str(ipaddress.IPv6Address(literal))
        except ValueError:
            raise FetchRefused("bad_host", f"invalid IPv6 literal [{literal}]") from None
    if not host:
        raise FetchRefused("bad_host", "URL has no host")
    _check_ipv4_form(host)
    try:
        ascii_host = host if host.isascii() else idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise FetchRefused("bad_host", f"host {host!r} is not a valid name: {exc}") from None
    ascii_host = ascii_host.lower()
    if not _HOST_CHARS.match(ascii_host) or ".." in ascii_host or ascii_host.startswith("."):
        raise FetchRefused("bad_host", f"host {ascii_host!r} is not a valid host name")
    _check_ipv4_form(ascii_host)
    return ascii_host


def _check_ipv4_form(host: str) -> None:
    """Refuse every IPv4 spelling except the canonical dotted quad.

    Following the URL standard, a host whose last label is a number is an IPv4
    address; we accept it only as four decimal parts 0–255 without leading zeros.
    """
    labels = host.split(".")
    if labels and labels[-1] == "" and len(labels) > 1:
        labels = labels[:-1]
    last = labels[-1] if labels else ""
    if not (_DIGITS.match(last) or _HEXISH.match(last)):
        return
    canonical = len(labels) == 4 and all(
        _DIGITS.match(p) and (p == "0" or not p.startswith("0")) and int(p) <= 255 for p in labels
    )
    if not canonical or host.endswith("."):
        raise FetchRefused(
            "odd_ipv4",
            f"host {host!r} is a non-canonical IPv4 form (decimal, octal, hex or short); "
            "write the address as four decimal numbers a.b.c.d",
        )


def _check_port(parts: SplitResult, scheme: str) -> int:
    try:
        port = parts.port
    except ValueError:
        raise FetchRefused("bad_port", "URL has an invalid port") from None
    if port is None:
        if parts.netloc.endswith(":"):
            raise FetchRefused("bad_port", "URL has an empty port")
        return 443 if scheme == "https" else 80
    if not 1 <= port <= 65535:
        raise FetchRefused("bad_port", f"port {port} is out of range")
    return port


# --- addresses ------------------------------------------------------------------------------

_V4_BLOCKED: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified ('this network')"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared address space (CGNAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignment"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved or broadcast"),
    )
)

_V6_UNSPECIFIED = ipaddress.IPv6Address("::")
_V6_LOOPBACK = ipaddress.IPv6Address("::1")
_V6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_V6_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_V6_COMPATIBLE = ipaddress.IPv6Network("::/96")
_V6_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_V6_6TO4 = ipaddress.IPv6Network("2002::/16")
_V6_TEREDO = ipaddress.IPv6Network("2001::/32")
_V6_BLOCKED: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), why)
    for net, why in (
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        ("fc00::/7", "unique local (private)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("2001::/23", "IETF protocol assignment"),
    )
)


def _embedded_v4(ip: ipaddress.IPv6Address, shift: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address((int(ip) >> shift) & 0xFFFFFFFF)


def blocked_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be fetched (e.g. ``"loopback"``), or None if it is public.

    IPv6 forms that carry an IPv4 address (mapped, NAT64, 6to4) are judged by
    that IPv4 address; the deprecated IPv4-compatible form and Teredo are
    always refused.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        for net4, why in _V4_BLOCKED:
            if ip in net4:
                return why
        return None
    if ip.scope_id:
        return "scoped (zone) address"
    if ip == _V6_UNSPECIFIED:
        return "unspecified"
    if ip == _V6_LOOPBACK:
        return "loopback"
    embedded = (
        (_V6_MAPPED, 0, "IPv4-mapped"),
        (_V6_NAT64, 0, "NAT64 form of a"),
        (_V6_6TO4, 80, "6to4 form of a"),
    )
    for net6, shift, form in embedded:
        if ip in net6:
            inner = blocked_reason(_embedded_v4(ip, shift))
            return f"{form} {inner}" if inner else None
    if ip in _V6_COMPATIBLE:
        return "IPv4-compatible (deprecated)"
    if ip in _V6_TEREDO:
        return "Teredo tunnel"
    for net6, why in _V6_BLOCKED:
        if ip in net6:
            return why
    if ip not in _V6_GLOBAL_UNICAST:
        return "reserved"
    return None


@functools.lru_cache(maxsize=64)
def parse_allowlist(networks: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    """Parse allowlist entries (``"127.0.0.0/8"``, ``"10.1.2.3"``) into networks.

    Raises ValueError naming the bad entry.
    """
    parsed: list[IPNetwork] = []
    for entry in networks:
        try:
            parsed.append(ipaddress.ip_network(str(entry).strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"allowlist entry {entry!r} is not a network: {exc}") from None
    return tuple(parsed)


@functools.lru_cache(maxsize=4096)
def _ip_or_none(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _unmapped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def check_address(address: str, allow: Iterable[str] = ()) -> str:
    """Refuse ``address`` unless it is public or inside an allowlisted network.

    Returns the address to connect to (an IPv4-mapped IPv6 address is returned as
    its IPv4 form). Raises :class:`FetchRefused` with code ``blocked_address``.
    """
    return _check_address(address, tuple(allow))


@functools.lru_cache(maxsize=4096)
def _check_address(address: str, allow: tuple[str, ...]) -> str:
    # Cached: a host's addresses come back on every fetch (refusals raise, uncached).
    ip = _ip_or_none(address)
    if ip is None:
        raise FetchRefused("bad_address", f"{address!r} is not an IP address")
    plain = _unmapped(ip)
    networks = parse_allowlist(allow)
    if any(plain.version == net.version and plain in net for net in networks):
        return str(plain)
    why = blocked_reason(ip)
    if why is not None:
        raise FetchRefused(
            "blocked_address",
            f"{address} is not a public address ({why}); set "
            f"{ALLOW_SETTING}={_network_of(plain)} where the agents run to allow it",
        )
    return str(plain)


def _network_of(ip: IPAddress) -> str:
    """The blocked network ``ip`` falls in, to suggest for the allowlist (else the address)."""
    if isinstance(ip, ipaddress.IPv4Address):
        for net4, _why in _V4_BLOCKED:
            if ip in net4:
                return str(net4)
        return f"{ip}/32"
    return f"{ip}/128"


def _admit(parsed: ParsedUrl, addresses: Sequence[str], allow: Iterable[str]) -> CheckedTarget:
    if not addresses:
        raise FetchRefused("dns_error", f"{parsed.host} has no address")
    allow = tuple(allow)
    checked: list[str] = []
    for address in addresses:
        try:
            checked.append(check_address(address, allow))
        except FetchRefused as exc:
            if parsed.is_ip_literal:
                raise
            # The message never names the address: what the agents' DNS answers for a
            # name (an intranet's layout) is not for the person who typed it.
            raise FetchRefused(
                exc.code,
                f"{parsed.host} is a private or loopback address, not a public one; set "
                f"{ALLOW_SETTING} to its network where the agents run (e.g. "
                f"{ALLOW_SETTING}=127.0.0.0/8 for this machine) to allow it",
            ) from None
    unique = tuple(dict.fromkeys(checked))
    return CheckedTarget(
        scheme=parsed.scheme,
        host=parsed.host,
        port=parsed.port,
        target=parsed.target,
        address=unique[0],
        addresses=unique,
    )


def system_resolve(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the system resolver (getaddrinfo), all families."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise FetchRefused("dns_error", f"{host} cannot be resolved: {_dns_failure(exc)}") from None
    return [str(info[4][0]) for info in infos]


_DNS_FAILURES = {
    socket.EAI_NONAME: "name not found",
    socket.EAI_AGAIN: "the name server did not answer (a temporary failure; try again later)",
    socket.EAI_FAIL: "the name server failed",
}
if hasattr(socket, "EAI_NODATA"):  # glibc: the name exists but has no address
    _DNS_FAILURES[socket.EAI_NODATA] = "the name has no address"


def _dns_failure(exc: BaseException) -> str:
    """Why a lookup failed, in plain words (never "[Errno -2] ...")."""
    if isinstance(exc, socket.gaierror) and exc.errno in _DNS_FAILURES:
        return _DNS_FAILURES[exc.errno]
    if isinstance(exc, UnicodeError):
        return "the name is not valid"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def check_url(
    url: str, *, allow: Iterable[str] = (), resolve: Resolver | None = None
) -> CheckedTarget:
    """Check ``url`` fully (syntax, then every resolved address); blocking DNS.

    ``allow`` lists admitted networks; ``resolve`` replaces the system resolver
    (it must return address strings). Raises :class:`FetchRefused`.
    """
    parsed = parse_url(url)
    if parsed.is_ip_literal:
        return _admit(parsed, [parsed.host], allow)
    addresses = (resolve or system_resolve)(parsed.host, parsed.port)
    return _admit(parsed, addresses, allow)


async def check_url_async(
    url: str,
    *,
    allow: Iterable[str] = (),
    resolve: AsyncResolver | None = None,
    timeout: float | None = None,
) -> CheckedTarget:
    """:func:`check_url` for asyncio: getaddrinfo runs in a worker thread.

    ``timeout`` bounds the DNS lookup (code ``dns_error`` when exceeded).
    """
    parsed = parse_url(url)
    if parsed.is_ip_literal:
        return _admit(parsed, [parsed.host], allow)
    try:
        async with asyncio.timeout(timeout):
            if resolve is not None:
                addresses = await resolve(parsed.host, parsed.port)
            else:
                addresses = await asyncio.to_thread(system_resolve, parsed.host, parsed.port)
    except TimeoutError:
        raise FetchRefused(
            "dns_error", f"{parsed.host} did not resolve within {timeout} s"
        ) from None
    return _admit(parsed, addresses, allow)
