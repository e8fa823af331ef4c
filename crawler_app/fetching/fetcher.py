"""Fetching pages: guarded, conditional, bounded and polite.

Every request — page, redirect hop, robots.txt — goes through one path:

1. the SSRF guard (:mod:`crawler_app.fetching.guard`) checks the URL and resolves the
   host once;
2. the connection goes to the address the guard checked: each request is made
   from its checked target, and the pool
   (:class:`~crawler_app.fetching.transport.PinnedPool`) connects to exactly that
   address and refuses anything else, while the request keeps the host name, so
   the ``Host`` header, the TLS server name (SNI) and certificate checks are
   those of the real host and kept-alive connections are never shared between
   host names or addresses;
3. per-host politeness (:mod:`crawler_app.fetching.politeness`) spaces and limits the
   requests and honours robots.txt and ``Retry-After``.

A fetch sends the stored validators back exactly as the server gave them
(``If-None-Match``/``If-Modified-Since``); a ``304`` is reported as
``not_modified`` without reading a body. Redirects are followed by hand, each
hop checked again. Bodies are streamed, decoded in bounded steps
(:mod:`crawler_app.fetching.decoding`) and cut at ``max_bytes``. The result is a
plain JSON-able dict (see :data:`RESULT_KEYS`); errors come back in it with a
short code (:data:`ERROR_CODES`) and a one-line message, never as exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import httpx

from .decoding import ACCEPT_ENCODING, BodyTooLarge, BoundedDecoder, DecodingError
from .fetch_settings import MAX_REDIRECTS, USER_AGENT, FetchSettings

__all__ = [
    "RESULT_KEYS",
    "USER_AGENT",
    "Answer",
    "FetchFailed",
    "FetchSettings",
    "Fetcher",
    "fetch",
    "make_pool",
    "text_fields",
    "tls_context",
]
from .guard import AsyncResolver, CheckedTarget, FetchRefused, check_url_async
from .politeness import (
    ROBOTS_MAX_BYTES,
    Politeness,
    RobotsAnswer,
    RobotsCache,
)
from .text import SelectorError, compile_selector, extract, fingerprint, media_type
from .transport import PinnedPool, Timeouts, TransportError

#: Bodies larger than this are parsed in a worker thread so the event loop stays free.
THREAD_PARSE_BYTES = 64 * 1024

ACCEPT = (
    "text/html,application/xhtml+xml,application/xml;q=0.9,text/plain;q=0.8,"
    "application/json;q=0.8,*/*;q=0.1"
)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: Why a private address is refused to a job that may not use the allowlist.
NOT_FOR_THIS_JOB = (
    "not a public address; the fetch allowlist (JODL_FETCH_ALLOW) serves only jobs of "
    "users named in JODL_FETCH_ALLOW_USERS"
)

#: Error codes a result may carry in ``error``.
ERROR_CODES = (
    "refused",  # the SSRF guard refused the URL or a redirect target (see error_reason)
    "dns_error",  # the host name does not resolve
    "robots_disallowed",  # robots.txt forbids the URL for our agent
    "timeout",  # connect, read or total time limit exceeded
    "connect_error",  # the connection could not be opened
    "network_error",  # the connection broke while talking
    "protocol_error",  # the server broke HTTP (or sent an undecodable body)
    "too_large",  # body longer than max_bytes
    "bad_content_type",  # not a text media type we read
    "too_many_redirects",
    "http_error",  # an answer other than 2xx, 3xx redirect or 304
    "bad_selector",  # the CSS selector cannot be parsed
    "error_page",  # a 2xx answer that reads as an error or maintenance page, or is blank
    "browser_error",  # the browser could not render the page (crawler_app.fetching.browser)
    "internal_error",  # a bug: reported, never raised
)

#: Keys of every result dict:
#: ``url`` as asked; ``final_url`` normalised URL of the last hop (None if refused at once);
#: ``status`` last HTTP status or None; ``ok`` True for a usable answer (2xx read, or 304);
#: ``not_modified`` True for a 304 to our validators; ``etag``/``last_modified`` the
#: validators to store, exactly as the server sent them; ``content_type`` the header;
#: ``size`` body bytes read; ``title`` the HTML title; ``text`` normalised visible text
#: (None without a body); ``truncated`` True if the text was cut to ``max_text_chars``;
#: ``fingerprint`` SHA-256 of ``text`` (None without a body); ``selector_matches``
#: elements the selector matched (None without a selector); ``redirects`` the URLs
#: redirected to, in order; ``elapsed`` seconds the call took, politeness waits
#: included; ``error`` a code from :data:`ERROR_CODES` or None; ``error_reason`` the
#: guard's code when ``error`` is ``refused``; ``error_message`` one line for people.
RESULT_KEYS = (
    "url", "final_url", "status", "ok", "not_modified", "etag", "last_modified",
    "content_type", "size", "title", "text", "truncated", "fingerprint",
    "selector_matches", "redirects", "elapsed", "error", "error_reason", "error_message",
)  # fmt: skip


DEFAULT_SETTINGS = FetchSettings()


def make_pool(settings: FetchSettings = DEFAULT_SETTINGS) -> PinnedPool:
    """The connection pool of a :class:`Fetcher`, to share between fetchers.

    Its connections go only to guard-checked addresses; it keeps no cookies (one
    user's page must not change what another's fetch sees: it reads no
    ``Set-Cookie`` and sends no ``Cookie``) and uses no proxy.
    """
    context = tls_context(settings.verify_tls, settings.ca_file)
    return PinnedPool(context, max_connections=settings.max_connections)


@functools.lru_cache(maxsize=8)
def tls_context(verify: bool, ca_file: str | None) -> ssl.SSLContext:
    """The TLS context of pools that ``verify`` certificates (against the public CAs
    and ``ca_file``, if named) or not; made once per process and shared, as aiohttp
    does with its own: loading the CA bundle takes 35–45 ms of CPU, which every new
    fetcher (a test's, a bench round's) paid. A context is only read once made, so
    pools may share it; a changed ``ca_file`` is read again by a new process."""
    context = httpx.create_ssl_context(verify=verify, trust_env=False)
    if verify and ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


#: Sent with every request before the caller's headers (a caller's header of the same
#: name replaces one of these): only the codings decoded in bounded steps
#: (:mod:`crawler_app.fetching.decoding`).
BASE_HEADERS = (
    ("Accept-Encoding", ACCEPT_ENCODING),
    ("Connection", "keep-alive"),
    ("Accept", ACCEPT),
)


# --- one fetch ------------------------------------------------------------------------------


class FetchFailed(Exception):
    """A fetch that failed: ``code`` from :data:`ERROR_CODES`, ``message`` one line."""

    def __init__(
        self, code: str, message: str, reason: str | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason
        self.detail = message if detail is None else detail  # the message without the URL

    @classmethod
    def at(cls, url: str, code: str, detail: str) -> FetchFailed:
        return cls(code, f"{url}: {detail}", detail=detail)


@dataclass
class Answer:
    """One HTTP answer as read."""

    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes | None  # None: not read
    complete: bool = True  # False: stopped at the size limit


class _Budget:
    """Network time left for one fetch.

    A request spends it through the pool's deadline (every wait of the request,
    its body's included, ends by then), not an ``asyncio.timeout`` of its own: one
    timer per wait instead of two, and no cancellation to undo."""

    __slots__ = ("total", "left")

    def __init__(self, seconds: float) -> None:
        self.total = seconds
        self.left = seconds

    def exceeded(self) -> FetchFailed:
        return FetchFailed("timeout", f"total time limit of {self.total:g} s exceeded")


def _accepted(kind: str, accepted: tuple[str, ...]) -> bool:
    return any(kind == a or (a.startswith("+") and kind.endswith(a)) for a in accepted)


def _new_result(url: str) -> dict[str, Any]:
    result: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    result.update(url=url, ok=False, not_modified=False, size=0, truncated=False, redirects=[])
    return result


class Fetcher:
    """Fetches many pages with one connection pool and one set of per-host limits.

    Use as ``async with Fetcher(settings) as f: await f.fetch(url)``; many
    fetches may run at once (``asyncio.gather``). ``pool`` must come from
    :func:`make_pool` (a pool given here is not closed by the fetcher);
    ``resolve`` replaces the system resolver (tests, custom DNS).
    """

    def __init__(
        self,
        settings: FetchSettings = DEFAULT_SETTINGS,
        *,
        pool: PinnedPool | None = None,
        politeness: Politeness | None = None,
        resolve: AsyncResolver | None = None,
    ) -> None:
        if pool is not None and not isinstance(pool, PinnedPool):
            raise ValueError("pool must be made by crawler_app.fetching.fetcher.make_pool()")
        self.settings = settings
        self._own_pool = pool is None
        self.pool = pool if pool is not None else make_pool(settings)
        self.politeness = politeness or Politeness(
            max_in_flight=settings.per_host_in_flight,
            min_interval=settings.per_host_interval,
            max_pause=settings.max_retry_after,
            obey_robots=settings.obey_robots,
            user_agent=settings.user_agent,
            robots_cache=RobotsCache(
                budget=settings.robots_cache_bytes,
                ttl=settings.robots_ttl,
                failure_ttl=settings.robots_failure_ttl,
            ),
        )
        self._resolve = resolve
        self._timeouts = Timeouts(
            connect=settings.connect_timeout,
            read=settings.read_timeout,
            pool=settings.total_timeout,
        )
        # Every page and robots.txt request sends these, built once.
        self._headers: tuple[tuple[str, str], ...] = (
            *BASE_HEADERS,
            ("User-Agent", settings.user_agent),
        )

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pool if this fetcher made it."""
        if self._own_pool:
            await self.pool.aclose()

    async def fetch(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        selector: str | None = None,
        use_allowlist: bool = True,
    ) -> dict[str, Any]:
        """Fetch ``url`` and return the result dict (keys: :data:`RESULT_KEYS`).

        ``etag``/``last_modified`` are the validators stored from the last fetch;
        ``selector`` a CSS selector the text is restricted to; ``use_allowlist``
        False treats ``settings.allow_networks`` as empty for this fetch, every hop
        and robots.txt included (a job whose asker may not use it, see
        :mod:`crawler_app.fetching.reach`). Never raises (except on cancellation).
        """
        result, _body = await self.fetch_with_body(
            url,
            etag=etag,
            last_modified=last_modified,
            selector=selector,
            use_allowlist=use_allowlist,
        )
        return result

    async def fetch_with_body(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        selector: str | None = None,
        use_allowlist: bool = True,
    ) -> tuple[dict[str, Any], bytes | None]:
        """:meth:`fetch`, also giving the body read: ``(result, body)``.

        ``body`` is the page's bytes when ``result["ok"]`` and a body was read
        (a 2xx answer), else None; a caller may look at it again (more CSS
        selectors, say) without a second fetch. Never raises.
        """
        started = time.monotonic()
        result = _new_result(url)
        body: bytes | None = None
        try:
            allow = self.settings.allow_networks if use_allowlist else ()
            body = await self._fetch(url, etag, last_modified, selector, result, allow)
        except FetchFailed as failure:
            result.update(
                ok=False, error=failure.code, error_reason=failure.reason,
                error_message=failure.message,
            )  # fmt: skip
        except Exception as exc:  # the contract: errors are reported, never raised
            result.update(
                ok=False, error="internal_error", error_message=f"{type(exc).__name__}: {exc}"
            )
        result["elapsed"] = round(time.monotonic() - started, 3)
        return result, body if result["ok"] else None

    async def _fetch(
        self,
        url: str,
        etag: str | None,
        last_modified: str | None,
        selector: str | None,
        result: dict[str, Any],
        allow: tuple[str, ...],
    ) -> bytes | None:
        """Fill ``result``; the body read (None for a 304). Raises :class:`FetchFailed`.

        ``allow``: the networks admitted although not public, at every hop."""
        if selector is not None:
            try:
                compile_selector(selector)
            except SelectorError as exc:
                raise FetchFailed("bad_selector", str(exc)) from None
        headers = self._headers
        if etag:
            headers += (("If-None-Match", etag),)
        if last_modified:
            headers += (("If-Modified-Since", last_modified),)
        budget = _Budget(self.settings.total_timeout)
        current = url
        for _hop in range(self.settings.max_redirects + 1):
            target = await self._check(current, budget, allow)
            result["final_url"] = target.url
            refusal = await self.politeness.robots_refusal(
                target, lambda robots_url: self._load_robots(robots_url, budget, allow)
            )
            if refusal is not None and refusal.code == "robots_disallowed":
                raise FetchFailed(refusal.code, refusal.message)
            if refusal is not None:  # robots.txt was out of reach: so is the page
                raise FetchFailed.at(target.url, refusal.code, refusal.message)
            answer = await self._exchange(target, headers, budget, self._page_body_wanted)
            result["status"] = answer.status
            result["content_type"] = answer.headers.get("content-type")
            location = answer.headers.get("location")
            if answer.status in REDIRECT_STATUSES and location:
                current = urljoin(target.url, location.strip())
                result["redirects"].append(current)
                continue
            return await self._finish(result, answer, etag, last_modified, selector)
        raise FetchFailed(
            "too_many_redirects", f"gave up after {self.settings.max_redirects} redirects"
        )

    def _page_body_wanted(self, status: int, headers: dict[str, str]) -> bool:
        if not 200 <= status < 300:
            return False
        kind = media_type(headers.get("content-type"))
        if kind and not _accepted(kind, self.settings.accepted_types):
            return False
        length = headers.get("content-length", "")
        return not (length.isdigit() and int(length) > self.settings.max_bytes)

    async def _finish(
        self,
        result: dict[str, Any],
        answer: Answer,
        etag: str | None,
        last_modified: str | None,
        selector: str | None,
    ) -> bytes | None:
        status, headers = answer.status, answer.headers
        if status == 304 and (etag or last_modified):
            result.update(
                ok=True, not_modified=True,
                etag=headers.get("etag", etag),
                last_modified=headers.get("last-modified", last_modified),
            )  # fmt: skip
            return None
        if not 200 <= status < 300:
            phrase = httpx.codes.get_reason_phrase(status)
            raise FetchFailed("http_error", f"the server answered {status} {phrase}".rstrip())
        kind = media_type(headers.get("content-type"))
        if kind and not _accepted(kind, self.settings.accepted_types):
            raise FetchFailed("bad_content_type", f"content type {kind!r} is not fetched")
        body = answer.body
        if body is None or not answer.complete:
            limit = self.settings.max_bytes
            raise FetchFailed("too_large", f"the body is larger than {limit} bytes")
        content_type = headers.get("content-type", "")
        if not kind:  # no declared type: sniff text from binary
            if b"\x00" in body[:1024]:
                raise FetchFailed("bad_content_type", "no content type and the body is binary")
            content_type = "text/html" if body.lstrip()[:1] == b"<" else "text/plain"
        result.update(
            await text_fields(body, content_type, selector, self.settings.max_text_chars),
            ok=True, etag=headers.get("etag"), last_modified=headers.get("last-modified"),
        )  # fmt: skip
        return body

    async def get_resource(
        self, url: str, headers: dict[str, str], max_bytes: int, use_allowlist: bool = True
    ) -> Answer:
        """One GET a rendered page asked for (:mod:`crawler_app.fetching.browser`).

        The same guard and pinned connection as every fetch (``use_allowlist`` as
        for :meth:`fetch`); no robots.txt and no per-host spacing (the renderer has
        limits of its own); a redirect is answered as it is (the browser follows it,
        each hop asking again). The body is decoded and cut at ``max_bytes``
        (``complete`` False). Raises :class:`FetchFailed`.
        """
        budget = _Budget(self.settings.total_timeout)
        allow = self.settings.allow_networks if use_allowlist else ()
        target = await self._check(url, budget, allow)
        names = {name.lower() for name in headers}
        sent = [item for item in BASE_HEADERS if item[0].lower() not in names]
        sent += headers.items()
        return await self._exchange(
            target, sent, budget, lambda _s, _h: True, max_bytes=max_bytes, polite=False
        )

    async def _check(self, url: str, budget: _Budget, allow: tuple[str, ...]) -> CheckedTarget:
        if budget.left <= 0:
            raise budget.exceeded()
        # DNS is bounded by the time left too: no timer of our own around the check.
        timeout = min(self.settings.connect_timeout, budget.left)
        started = time.monotonic()
        try:
            return await check_url_async(url, allow=allow, resolve=self._resolve, timeout=timeout)
        except FetchRefused as exc:
            if exc.code == "dns_error" and timeout < self.settings.connect_timeout:
                if time.monotonic() - started >= timeout:
                    raise budget.exceeded() from None
            if exc.code == "dns_error":
                raise FetchFailed("dns_error", exc.message) from None
            message = exc.message
            if exc.code == "blocked_address" and self.settings.allow_networks and not allow:
                # The allowlist exists but is not this job's: saying to set it misleads.
                message = NOT_FOR_THIS_JOB
            raise FetchFailed("refused", f"{url}: {message}", reason=exc.code) from None
        finally:
            budget.left -= time.monotonic() - started

    async def _exchange(
        self,
        target: CheckedTarget,
        headers: Sequence[tuple[str, str]],
        budget: _Budget,
        body_wanted: Callable[[int, dict[str, str]], bool],
        *,
        max_bytes: int | None = None,
        polite: bool = True,
    ) -> Answer:
        """One GET to the checked address with ``headers`` (all of them), inside the
        host's politeness slot (``polite``), spending ``budget``."""
        limit = self.settings.max_bytes if max_bytes is None else max_bytes
        slot = self.politeness.slot(target.host) if polite else contextlib.nullcontext()
        async with slot:
            if budget.left <= 0:
                raise budget.exceeded()
            started = time.monotonic()
            deadline = asyncio.get_running_loop().time() + budget.left
            try:
                return await self._send(target, headers, body_wanted, limit, deadline)
            except TransportError as exc:
                if exc.deadline:
                    raise budget.exceeded() from None
                detail = _TRANSPORT_DETAIL[exc.code].format(_describe(exc))
                raise FetchFailed.at(target.url, exc.code, detail) from None
            finally:
                budget.left -= time.monotonic() - started

    async def _send(
        self,
        target: CheckedTarget,
        headers: Sequence[tuple[str, str]],
        body_wanted: Callable[[int, dict[str, str]], bool],
        limit: int,
        deadline: float,
    ) -> Answer:
        response = await self.pool.get(target, headers, self._timeouts, deadline)
        try:
            status, answered = response.status, response.headers
            self.politeness.note_response(target.host, status, answered.get("retry-after"))
            if not body_wanted(status, answered):
                return Answer(status, answered, None)
            decoder = BoundedDecoder(answered.get("content-encoding"), limit)
            try:
                while True:
                    chunk = response.ready()  # None: not yet arrived
                    if chunk is None:
                        chunk = await response.piece()
                    if not chunk:
                        break
                    decoder.feed(chunk)
                return Answer(status, answered, decoder.finish())
            except BodyTooLarge as cut:
                return Answer(status, answered, cut.data[:limit], False)
            except DecodingError as exc:
                raise FetchFailed.at(target.url, "protocol_error", str(exc)) from None
        finally:
            response.close()

    async def _load_robots(
        self, robots_url: str, budget: _Budget, allow: tuple[str, ...]
    ) -> RobotsAnswer:
        """robots.txt through the guarded path (status None and why, if unreachable)."""
        current = robots_url
        status: int | None = None
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                target = await self._check(current, budget, allow)
            except FetchFailed as failure:
                # A refused redirect target is "unavailable" (allow); DNS trouble "unreachable".
                if failure.code in ("dns_error", "timeout"):
                    return RobotsAnswer(None, "", (failure.code, failure.detail))
                return RobotsAnswer(404)
            try:
                answer = await self._exchange(
                    target,
                    self._headers,
                    budget,
                    lambda status, _headers: 200 <= status < 300,
                    max_bytes=ROBOTS_MAX_BYTES,
                )
            except FetchFailed as failure:
                if failure.code == "refused":  # a redirect we do not follow: as above
                    return RobotsAnswer(404)
                return RobotsAnswer(None, "", (failure.code, failure.detail))
            status = answer.status
            location = answer.headers.get("location")
            if status in REDIRECT_STATUSES and location:
                current = urljoin(target.url, location.strip())
                continue
            body = answer.body or b""
            return RobotsAnswer(status, body.decode("utf-8", errors="replace"))
        return RobotsAnswer(status)


async def text_fields(
    body: bytes, content_type: str, selector: str | None, max_chars: int
) -> dict[str, Any]:
    """The result fields of a page's text: size, title, text (cut at ``max_chars``),
    truncated, fingerprint, selector_matches. A large body is parsed in a worker thread."""
    if len(body) > THREAD_PARSE_BYTES:
        page = await asyncio.to_thread(extract, body, content_type, selector=selector)
    else:
        page = extract(body, content_type, selector=selector)
    text = page.text
    truncated = len(text) > max_chars
    if truncated:
        text = text[:max_chars].rstrip()
    return {
        "size": len(body),
        "title": page.title,
        "text": text,
        "truncated": truncated,
        # extract() normalised the text; a cut one is normalised again to be safe.
        "fingerprint": fingerprint(text, normalised=not truncated),
        "selector_matches": page.selector_matches,
    }


#: A transport failure's detail in a result's message, by its code.
_TRANSPORT_DETAIL = {
    "timeout": "{}",
    "connect_error": "cannot connect: {}",
    "protocol_error": "the server broke HTTP: {}",
}

_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")


def _describe(exc: Exception) -> str:
    """The first line of ``exc`` for people: no "[Errno 111]", no class name."""
    lines = _ERRNO.sub("", str(exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


async def fetch(
    url: str,
    *,
    etag: str | None = None,
    last_modified: str | None = None,
    selector: str | None = None,
    settings: FetchSettings = DEFAULT_SETTINGS,
    pool: PinnedPool | None = None,
    politeness: Politeness | None = None,
) -> dict[str, Any]:
    """Fetch one page; see :meth:`Fetcher.fetch`. Never raises.

    ``pool`` (from :func:`make_pool`) and ``politeness`` are reused when given;
    otherwise this call makes its own (and reads the host's robots.txt).
    """
    try:
        fetcher = Fetcher(settings, pool=pool, politeness=politeness)
    except ValueError as exc:
        result = _new_result(url)
        result.update(error="internal_error", error_message=str(exc))
        return result
    try:
        return await fetcher.fetch(url, etag=etag, last_modified=last_modified, selector=selector)
    finally:
        await fetcher.aclose()
