"""Pages rendered in Debian's Chromium by a real agent (crawler_app.fetching.browser).

A page whose text is built by its scripts is flagged to a tracker who checks it
without the browser; with the browser on, its rendered text is the baseline and
an edit of it is mailed. The page's own request to another loopback address
(not allowlisted: the agents admit only 127.0.0.1, the test site) is refused by
the SSRF guard, counted and shown, and never reaches that address; its script
from the site itself is fetched through the guarded client.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from agents import run_jodl
from app_support import add_users_tracking, agent_env, app_settings, inbox, run_app_cycle
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from crawler_app.models import Page, Snapshot
from crawler_app.users.pages import SCRIPT_PAGE_NOTE, normalise_url, page_note

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest

CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does) to run it",
    ),
]

SCRIPT = "document.getElementById('shop').innerHTML = '<p>' + PRICE + '</p><p>Open daily</p>';"


def shop(price: int, secret_url: str) -> str:
    """A page with no text of its own: its script (from the site) writes it."""
    return (
        "<html><head><title>Shop</title>"
        f"<script>var PRICE = 'Tea {price} EUR';</script></head>"
        f"<body><div id=shop></div><img src='{secret_url}' alt=''>"
        f"<script>fetch('{secret_url}').catch(function () {{}});</script>"
        "<script src='/app.js'></script></body></html>"
    )


def page_row(store, url: str) -> Page:
    with sessionmaker(store.engine)() as s:
        page = s.scalar(select(Page).where(Page.url == normalise_url(url)))
        assert page is not None
        s.expunge(page)
        return page


def test_a_script_built_page_is_read_in_the_browser_and_its_loopback_request_refused(
    store, agents, settings, site: TestSite, make_site, inbox, db_url
):
    secret = make_site("127.0.0.2")
    secret.set_page("/secret", "<p>internal</p>")
    site.set_page("/app.js", SCRIPT, content_type="application/javascript")
    site.set_page("/shop", shop(4, secret.url("/secret")))
    url = site.url("/shop")
    add_users_tracking(store, url, ["ann@example.org"])
    env = agent_env(inbox, allow="127.0.0.1/32")
    env["JODL_BROWSER_SETTLE"] = "0.5"
    agents(1, env=env)
    app = app_settings()

    # Without the browser: no text, scripts: Ann is told to turn the browser on.
    run_app_cycle(store, settings, app)
    page = page_row(store, url)
    assert page.script_page and not page.browser
    assert page_note(page) == SCRIPT_PAGE_NOTE

    # Bob turns it on (the command's --browser): the page is rendered for both of them.
    done = run_jodl(
        "track", url, "--user", "bob@example.org", "--browser", env={"JODL_DATABASE_URL": db_url}
    )
    assert done.returncode != 0 and "no user bob@example.org" in done.stderr
    add_users_tracking(store, url, ["bob@example.org"])
    done = run_jodl(
        "track", url, "--user", "bob@example.org", "--browser", env={"JODL_DATABASE_URL": db_url}
    )
    assert done.returncode == 0, done.stderr
    assert "in a browser" in done.stdout
    second = run_app_cycle(store, settings, app)
    assert second.errors == 0 and second.changed == 0
    page = page_row(store, url)
    assert page.browser and not page.script_page
    with sessionmaker(store.engine)() as s:
        (text,) = [
            snap.text for snap in s.scalars(select(Snapshot).where(Snapshot.page_id == page.id))
        ][-1:]
    assert "Tea 4 EUR" in text and "Open daily" in text
    # The page's requests to 127.0.0.2 were refused (the image, the fetch), none arrived.
    assert page.refused_requests and page.refused_requests >= 2
    assert "refused" in (page_note(page) or "")
    assert secret.requests() == []
    assert site.requests("/app.js")

    site.set_page("/shop", shop(5, secret.url("/secret")))
    third = run_app_cycle(store, settings, app)
    assert (third.changed, third.sent) == (1, 2)
    for address in ("ann@example.org", "bob@example.org"):
        (mail,) = inbox.to(address)
        assert "- Tea 4 EUR" in mail.text and "+ Tea 5 EUR" in mail.text
    assert secret.requests() == []
