"""End to end in a real browser (Debian Chromium driven by Playwright) against ``jodl up``.

Submits URLs of the local test site in the form, and watches the results appear
on the batch page while the slow page is still being fetched; hostile text from
a page shows as text; the page's scripts run under the strict CSP without a
violation; an operator sees the live status. Screenshots go to ``artifacts/``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from test_web_up import LOGIN_LINE, UP_LINE, start_up, wait_up

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
            page = browser.new_page()

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
            page.screenshot(path=str(ARTIFACTS / "browser-admin.png"), full_page=True)
            browser.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert problems == []
    assert (ARTIFACTS / "browser-batch.png").stat().st_size > 0
