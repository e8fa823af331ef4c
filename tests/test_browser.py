"""End to end in a real browser (Debian Chromium driven by Playwright) against ``jodl up``.

Submits URLs of the local test site in the form, and watches the results appear
on the batch page while the slow page is still being fetched; hostile text from
a page shows as text; the page's scripts run under the strict CSP without a
violation; an operator sees the live status, in the reader's local time. A tracked
page's "Check now" shows a fresh result. On a phone-sized screen no page scrolls
sideways. When the server goes away, the live indicator says so. A tracked page
that changes reaches its tracker as a digest, seen on the operator's mail sink
page. Screenshots go to ``artifacts/``.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import pytest
from agents import wait_for
from sqlalchemy import func, select
from test_web_up import LOGIN_LINE, UP_LINE, start_up, wait_up

from crawler_app.checking.confirm import BASELINE_FETCHES
from crawler_app.models import AppCycle
from jodl.log import make_engine

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOSTILE_TITLE = "<img src=x onerror=alert(1)>"
#: The reader's time zone: far from the server's UTC, with a half hour.
READER_ZONE = "Asia/Kolkata"
#: A phone's screen (CSS pixels).
PHONE = {"width": 360, "height": 740}
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")
#: Seconds one application cycle of a single page may take here, however loaded.
CYCLE_DEADLINE = 90.0

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does) to run it",
    ),
]


def test_results_appear_live_in_the_browser(tmp_path: Path, site: TestSite) -> None:
    from playwright.sync_api import expect, sync_playwright

    site.set_page("/fast", "<title>Fast page</title><p>quick answer</p>")
    site.set_page("/slow", "<title>Slow page</title><p>late answer</p>", delay=4.0)
    site.set_page("/evil", f"<title>{HOSTILE_TITLE}</title><p><script>alert(2)</script>x</p>")
    site.set_page("/gone", "no", status=404)
    ARTIFACTS.mkdir(exist_ok=True)
    log = tmp_path / "up.log"
    proc = start_up(tmp_path, log)
    problems: list[str] = []
    try:
        out = wait_up(proc, log)
        url = UP_LINE.search(out).group(1)  # type: ignore[union-attr]
        email, login_file = LOGIN_LINE.search(out).groups()  # type: ignore[union-attr]
        password = Path(login_file).read_text().split()[1]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(timezone_id=READER_ZONE, locale="en-GB")

            def console(msg: Any) -> None:
                if msg.type == "error":
                    problems.append(msg.text)

            page.on("console", console)
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
            # Signed in: the allowlisted loopback site serves signed-in users only.
            page.goto(url + "login")
            page.fill("#email", email)
            page.fill("#password", password)
            page.click("form button[type=submit]")
            page.goto(url)
            urls = [site.url(p) for p in ("/slow", "/fast", "/evil", "/gone")] + ["ftp://nope"]
            page.fill("#urls", "\n".join(urls))
            page.click("#submit-form button[type=submit]")
            page.wait_for_url("**/batches/*")
            batch_url = page.url
            rows = {
                p: page.locator(f"#item-{i}")
                for i, p in enumerate(("slow", "fast", "evil", "gone", "ftp"))
            }
            # Live: the fast page is shown while the slow one is still being fetched.
            expect(rows["fast"]).to_have_class("ok", timeout=30_000)
            expect(rows["fast"].locator(".title")).to_have_text("Fast page")
            expect(rows["slow"]).to_have_class("waiting")
            assert not site.requests("/slow"), "the slow page was already answered"
            page.screenshot(path=str(ARTIFACTS / "browser-batch-live.png"), full_page=True)
            expect(page.locator("#batch-state")).to_have_text(
                "Complete: all 5 URLs answered.", timeout=30_000
            )
            expect(rows["slow"]).to_have_class("ok")
            expect(rows["slow"].locator(".excerpt")).to_have_text("late answer")
            expect(rows["evil"].locator(".title")).to_have_text(HOSTILE_TITLE)
            assert page.locator("#results img").count() == 0
            expect(rows["gone"]).to_have_class("failed")
            expect(rows["gone"].locator(".status")).to_have_text("404")
            expect(rows["ftp"].locator(".excerpt")).to_contain_text("scheme")
            page.screenshot(path=str(ARTIFACTS / "browser-batch.png"), full_page=True)

            # The operator sees the live status (scripts run under the CSP).
            page.goto(url + "admin/")
            expect(page.locator("#live-state")).to_contain_text("updated", timeout=15_000)
            expect(page.locator("#nodes tbody tr")).to_have_count(2)
            # Times read in the reader's zone, with how long ago; never raw ISO text.
            seen = page.locator("#nodes tbody tr time")
            expect(seen).to_have_count(2, timeout=15_000)
            iso = seen.first.get_attribute("datetime") or ""
            local = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
            local = local.astimezone(ZoneInfo(READER_ZONE))
            shown = seen.first.inner_text()
            assert local.strftime("%H:%M") in shown and "UTC" not in shown, shown
            assert not ISO.search(page.locator("main").inner_text())
            page.screenshot(path=str(ARTIFACTS / "browser-admin.png"), full_page=True)

            # A tracked page: its next check is shown, and "Check now" fetches it afresh
            # (its earlier result is in the cache) and shows what it answers.
            page.goto(url + "pages")
            before = len(site.requests("/fast"))
            page.fill("input[name=url]", site.url("/fast"))
            page.click("form.row button[type=submit]")
            tracked = page.locator("#tracked tbody tr")
            expect(tracked).to_have_count(1)
            expect(tracked.locator(".next-check time")).to_have_count(1)
            # Tracking takes the page's baseline at once, from its fetches.
            wait_for(
                lambda: len(site.requests("/fast")) >= before + 1 + BASELINE_FETCHES,
                30,
                "the new tracking's baseline",
            )
            fetched = len(site.requests("/fast"))
            tracked.locator("form.check-now button").click()
            page.wait_for_url("**/batches/*")
            expect(page.locator("#item-0")).to_have_class("ok", timeout=30_000)
            expect(page.locator("#item-0 .status")).to_have_text("200")  # not "(cached)"
            # Fetched afresh (a cached answer would fetch nothing; a baseline not yet
            # stored when the button is pressed may be taken again with it).
            assert len(site.requests("/fast")) > fetched

            # On a phone, tables scroll in their own box: the page never scrolls sideways.
            page.set_viewport_size(PHONE)
            for where in (batch_url, url + "pages", url + "admin/", url):
                page.goto(where)
                if where == batch_url:
                    expect(page.locator("#batch-state")).to_contain_text("Complete")
                wider = page.evaluate(
                    "document.documentElement.scrollWidth - document.documentElement.clientWidth"
                )
                assert wider <= 0, f"{where} is {wider}px wider than a phone's screen"
            page.goto(batch_url)
            expect(page.locator("#batch-state")).to_contain_text("Complete")
            page.screenshot(path=str(ARTIFACTS / "browser-phone-batch.png"), full_page=True)

            # The server goes away: the live indicator says so instead of "Live".
            page.set_viewport_size({"width": 1280, "height": 800})
            page.goto(url + "admin/")
            live = page.locator("#live-state")
            expect(live).to_have_attribute("data-state", "ok", timeout=15_000)
            # From here the browser's failed reconnects are expected console errors.
            page.remove_listener("console", console)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
            expect(live).to_have_attribute(
                "data-state", re.compile("^(reconnecting|offline)$"), timeout=30_000
            )
            expect(live).not_to_contain_text("Live")
            page.screenshot(path=str(ARTIFACTS / "browser-admin-offline.png"), full_page=True)
            browser.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert problems == []
    assert (ARTIFACTS / "browser-batch.png").stat().st_size > 0


def cycles_finished(database: Path) -> int:
    """Application cycles of ``jodl up``'s database that ran to their end."""
    engine = make_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as conn:
            return int(
                conn.scalar(
                    select(func.count())
                    .select_from(AppCycle)
                    .where(AppCycle.finished_at.is_not(None))
                )
                or 0
            )
    finally:
        engine.dispose()


def test_a_changed_page_reaches_the_mail_sink(tmp_path: Path, site: TestSite) -> None:
    from playwright.sync_api import expect, sync_playwright

    site.set_page("/watched", "<title>Watched page</title><p>the first text</p>")
    ARTIFACTS.mkdir(exist_ok=True)
    log = tmp_path / "up.log"
    # Only the operator's requests start cycles, and each checks every page at once.
    proc = start_up(tmp_path, log, {"JODL_SCHEDULE": "off", "JODL_CHECK_SPREAD": "0"})
    database = tmp_path / "jodl.db"
    try:
        out = wait_up(proc, log)
        url = UP_LINE.search(out).group(1)  # type: ignore[union-attr]
        email, login_file = LOGIN_LINE.search(out).groups()  # type: ignore[union-attr]
        password = Path(login_file).read_text().split()[1]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page()
            page.goto(url + "login")
            page.fill("#email", email)
            page.fill("#password", password)
            page.click("form button[type=submit]")
            page.wait_for_url(url)
            # The operator tracks the page (the digest goes to the operator's address).
            page.goto(url + "pages")
            page.fill("input[name=url]", site.url("/watched"))
            page.click("form.row button[type=submit]")
            expect(page.locator("#tracked tbody tr")).to_have_count(1)

            def cycle_now() -> None:
                """Start a cycle on the admin page; return once it has run to its end."""
                before = cycles_finished(database)
                page.goto(url + "admin/")
                page.click("form[action$='/admin/cycle'] button[type=submit]")
                wait_for(
                    lambda: cycles_finished(database) > before,
                    CYCLE_DEADLINE,
                    "the requested cycle to finish",
                )

            def mail_page_text() -> str:
                page.goto(url + "admin/mail")
                return page.locator("main").inner_text()

            cycle_now()  # the page as first seen: nothing to tell
            assert len(site.requests("/watched")) >= 1
            assert "No mail yet" in mail_page_text()
            site.set_page("/watched", "<title>Watched page</title><p>the second text</p>")
            cycle_now()  # the change, confirmed by a second fetch in the same check: mailed
            page.goto(url + "admin/mail")
            digest = page.locator(".mail")
            expect(digest).to_have_count(1)
            expect(digest.locator("h2")).to_have_text("JODL: 1 tracked page changed")
            expect(digest.locator(".meta")).to_contain_text(f"to {email}")
            expect(digest.locator("pre")).to_contain_text(site.url("/watched"))
            expect(digest.locator("pre")).to_contain_text("the second text")
            # `jodl up` gave the master the URL it serves: the digest links to the UI.
            expect(digest.locator("pre")).to_contain_text(url + "pages/")
            page.screenshot(path=str(ARTIFACTS / "browser-mail-digest.png"), full_page=True)
            # The page's history shows the change as people read it: the changed word
            # marked within its line, no diff syntax.
            page.goto(url + "pages")
            page.locator("#tracked tbody tr a").first.click()
            inline = page.locator("#diff-inline")
            expect(inline.locator("del")).to_have_text(["first"])
            expect(inline.locator("ins")).to_have_text(["second"])
            expect(inline.locator("tr.add td.text")).to_have_text(["the second text"])
            assert "@@" not in inline.inner_text()
            page.click("text=Side by side")
            expect(page.locator("#diff-side tr.change del")).to_have_text(["first"])
            expect(page.locator("#diff-side tr.change ins")).to_have_text(["second"])
            page.screenshot(path=str(ARTIFACTS / "browser-word-diff.png"), full_page=True)
            browser.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
