"""Pages rendered in a browser: Debian's Chromium driven by Playwright, on the agents.

A page that builds its text with JavaScript shows a fetch nothing. For a page
whose tracker turned the browser on, ``check_page`` renders it instead, and the
rendered page (its DOM as HTML) goes through the same text extraction and change
detection as a fetched one. The browser never touches the network itself:

* the **document** is fetched by the agent's :class:`~crawler_app.fetching.fetcher.Fetcher`
  (SSRF guard, robots.txt, per-host politeness, size limits) and handed to the
  browser;
* **every request the page makes** is intercepted. A GET passes the same SSRF
  guard as every fetch and is made by the same client, connected to the address
  the guard checked (a DNS answer that changes in between cannot redirect it).
  A refused request is aborted and counted; the page's trackers see the count.
  Other methods, requests past the limits, WebSockets and service workers are
  refused too;
* the browser is started with a proxy that leads nowhere, so a request that would
  escape the interception fails instead of reaching the network.

Limits of its own (:class:`~crawler_app.fetching.fetch_settings.BrowserSettings`): the
time a rendering may take, the requests it may make and the bytes their answers
may hold, and how many pages an agent renders at once. One browser per agent
process, started on first use (about 3 s) and kept; one fresh context (no
cookies, no cache) per rendering.

Playwright is an optional dependency (``pip install 'jodl[browser]'``); it drives
the Chromium installed by the system (``JODL_BROWSER_PATH``) and never downloads
one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..metrics import BROWSER_REQUESTS
from .fetch_settings import BrowserSettings
from .fetcher import Fetcher, FetchFailed, text_fields

if TYPE_CHECKING:
    from playwright.async_api import Browser, Playwright, Route

#: Chromium's switches: no sandbox (agents often run as root in containers), no GPU,
#: none of the browser's own background traffic, and WebRTC never sends UDP outside
#: the (dead) proxy, so it cannot reach addresses the guard would refuse.
ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--dns-prefetch-disable",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)
#: Where the browser's own connections would go: the discard port of the loopback,
#: where nothing listens. Every request is answered by the interception instead.
DEAD_PROXY = "http://127.0.0.1:9"
#: Answer headers not handed to the browser: the body is given decoded and whole,
#: and a rendering keeps no cookies.
_DROPPED = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive",
     "set-cookie", "set-cookie2"}
)  # fmt: skip
#: Refused requests named in a result, at most.
EXAMPLES = 5


class RenderFailed(Exception):
    """A rendering that did not give a page (one line saying why)."""


@dataclass
class Tally:
    """What one rendering's requests came to."""

    #: The rendering's requests may reach the fetch allowlist (the job's reach).
    use_allowlist: bool = True
    requests: int = 0
    refused: int = 0
    bytes: int = 0
    examples: list[str] = field(default_factory=list)

    def refuse(self, why: str) -> None:
        self.refused += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(why[:300])

    def as_result(self) -> dict[str, Any]:
        return {"requests": self.requests, "refused": self.refused, "examples": self.examples}


class Renderer:
    """Renders pages with one browser per agent, through the agent's fetcher."""

    def __init__(self, fetcher: Fetcher, settings: BrowserSettings) -> None:
        self.fetcher = fetcher
        self.settings = settings
        self._slots = asyncio.Semaphore(settings.pages)
        self._start_lock = asyncio.Lock()
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None

    async def render(
        self, url: str, use_allowlist: bool = True
    ) -> tuple[dict[str, Any], bytes | None]:
        """Like :meth:`Fetcher.fetch_with_body`, the page as the browser shows it.

        The result has the text of the rendered page and ``browser``: the requests
        the page made and how many were refused (``examples``: a few, with why).
        ``use_allowlist`` False: the document and every request of the page are
        refused private addresses whatever ``JODL_FETCH_ALLOW`` admits.
        Errors come back in the result (``browser_error``, ``timeout``), never raised.
        """
        result, body = await self.fetcher.fetch_with_body(url, use_allowlist=use_allowlist)
        if not result.get("ok") or body is None:
            return result, body
        tally = Tally(use_allowlist=use_allowlist)
        try:
            async with self._slots, asyncio.timeout(self.settings.timeout):
                html = await self._render(result["final_url"] or url, body, result, tally)
        except TimeoutError:
            message = f"the page did not render within {self.settings.timeout:g} s"
            result.update(ok=False, error="timeout", error_message=message)
            return result, None
        except RenderFailed as exc:
            result.update(ok=False, error="browser_error", error_message=str(exc))
            return result, None
        finally:
            result["browser"] = tally.as_result()
        result.update(
            await text_fields(html, "text/html", None, self.fetcher.settings.max_text_chars)
        )
        return result, html

    async def _render(
        self, url: str, document: bytes, result: dict[str, Any], tally: Tally
    ) -> bytes:
        from playwright.async_api import Error as PlaywrightError

        browser = await self._started()
        try:
            context = await browser.new_context(
                service_workers="block",
                user_agent=self.fetcher.settings.user_agent,
                accept_downloads=False,
            )
        except PlaywrightError as exc:
            self._browser = None  # gone (crashed, killed): started again next time
            raise RenderFailed(f"the browser could not open a page: {_first_line(exc)}") from None
        try:
            served = False

            async def answer(route: Route) -> None:
                nonlocal served
                request = route.request
                if not served and request.is_navigation_request():  # the document itself
                    served = True
                    headers = {"content-type": result.get("content_type") or "text/html"}
                    await route.fulfill(status=200, headers=headers, body=document)
                    return
                await self._subrequest(route, tally)

            await context.route("**/*", answer)
            await context.route_web_socket("**/*", lambda ws: _refuse_socket(ws, tally))
            page = await context.new_page()
            await page.goto(url, wait_until="load")
            if self.settings.settle > 0:
                try:
                    quiet = self.settings.settle * 1000
                    await page.wait_for_load_state("networkidle", timeout=quiet)
                except PlaywrightError:
                    pass  # still busy (a poll, a stream): read what is there
            html = await page.content()
        except PlaywrightError as exc:
            raise RenderFailed(f"the browser failed: {_first_line(exc)}") from None
        finally:
            try:
                await context.close()
            except PlaywrightError:
                self._browser = None
        return html.encode("utf-8")

    async def _subrequest(self, route: Route, tally: Tally) -> None:
        """Answer one request of the page through the guarded client, or refuse it."""
        request = route.request
        tally.requests += 1
        why: str | None = None
        if request.method != "GET":
            why = f"{request.method} {request.url}: only GET requests are made for a page"
        elif tally.requests > self.settings.max_requests:
            why = f"{request.url}: more than {self.settings.max_requests} requests"
        elif tally.bytes >= self.settings.max_bytes:
            why = f"{request.url}: the page's answers passed {self.settings.max_bytes} bytes"
        if why is None:
            headers = {"User-Agent": self.fetcher.settings.user_agent}
            if accept := request.headers.get("accept"):
                headers["Accept"] = accept
            try:
                answer = await self.fetcher.get_resource(
                    request.url,
                    headers,
                    self.settings.max_bytes - tally.bytes,
                    use_allowlist=tally.use_allowlist,
                )
            except FetchFailed as exc:
                if exc.code == "refused":
                    BROWSER_REQUESTS.labels("refused").inc()
                    tally.refuse(exc.message)
                else:
                    BROWSER_REQUESTS.labels("failed").inc()
                await route.abort("blockedbyclient" if exc.code == "refused" else "failed")
                return
            body = answer.body or b""
            tally.bytes += len(body)
            BROWSER_REQUESTS.labels("ok").inc()
            kept = {k: v for k, v in answer.headers.items() if k not in _DROPPED}
            await route.fulfill(status=answer.status, headers=kept, body=body)
            return
        BROWSER_REQUESTS.labels("refused").inc()
        tally.refuse(why)
        await route.abort("blockedbyclient")

    async def _started(self) -> Browser:
        """The agent's browser, started on first use (and again after a crash)."""
        async with self._start_lock:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            try:
                from playwright.async_api import Error as PlaywrightError
                from playwright.async_api import async_playwright
            except ImportError:
                raise RenderFailed(
                    "Playwright is not installed on this agent: pip install 'jodl[browser]'"
                ) from None
            try:
                if self._playwright is None:
                    self._playwright = await async_playwright().start()
                self._browser = await self._playwright.chromium.launch(
                    executable_path=self.settings.path,
                    args=list(ARGS),
                    proxy={"server": DEAD_PROXY},
                )
            except PlaywrightError as exc:
                raise RenderFailed(
                    f"cannot start the browser {self.settings.path} (JODL_BROWSER_PATH): "
                    f"{_first_line(exc)}"
                ) from None
            return self._browser

    async def aclose(self) -> None:
        """Stop the browser and its driver."""
        if self._browser is not None:
            await self._browser.close()
            self._browser = None
        if self._playwright is not None:
            await self._playwright.stop()
            self._playwright = None


async def _refuse_socket(ws: Any, tally: Tally) -> None:
    BROWSER_REQUESTS.labels("refused").inc()
    tally.refuse(f"{ws.url}: WebSockets are not opened for a page")
    await ws.close()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
