"""Dynamic noise never alerts over ten cycles, while real edits do, exactly once each,
in the cycle that first sees them."""

from __future__ import annotations

import random
from collections.abc import Callable

from app_support import add_users_tracking, agent_env, app_settings, inbox, run_app_cycle

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest

CYCLES = 10
ARTICLE = "<h1>Opening hours</h1><p>Mon-Fri 9-17</p><p>Sat 10-14</p>"


def doc(body: str, head: str = "") -> str:
    return f"<html><head><title>Shop</title>{head}</head><body>{body}</body></html>"


def per_request(seed: int) -> dict[str, Callable[[int, dict[str, str]], dict[str, str]]]:
    """Pages that differ on every request: what each serves for its n-th request."""
    banners = ["Sale on shoes", "New: umbrellas", "Free delivery"]
    pick = random.Random(seed)
    return {
        # A clock and a visit counter: new text on every fetch.
        "/clock": lambda n, _: {
            "body": doc(f"{ARTICLE}<p>Server time 12:{n % 60:02d}:{n * 7 % 60:02d}</p>")
        },
        "/counter": lambda n, _: {"body": doc(f"{ARTICLE}<footer>{1000 + n * 37} visits</footer>")},
        # A rotating block: one of three banners at random.
        "/rotating": lambda n, _: {
            "body": doc(f"<div class=banner>{pick.choice(banners)}</div>{ARTICLE}")
        },
        # A page flipping between two states (A/B test).
        "/flip": lambda n, _: {
            "body": doc(ARTICLE + pick.choice(["<p>Variant A</p>", "<p>Variant B</p>"]))
        },
    }


def noisy_pages(i: int) -> dict[str, tuple[str, dict[str, str]]]:
    """What each path with per-cycle noise serves in cycle ``i`` (body, headers)."""
    return {
        # Tokens in scripts, styles, attributes: invisible, with a new ETag each time.
        "/tokens": (
            doc(
                f'{ARTICLE}<form><input type=hidden name=csrf value="tok{i}"></form>'
                f"<script>window.nonce = 'n{i}';</script>",
                head=f'<meta name="csrf-token" content="c{i}"><style>.x{i} {{}}</style>',
            ),
            {"ETag": f'"tokens-{i}"'},
        ),
        # Errors, empty bodies and blank pages in between the same content.
        "/flaky": (doc(ARTICLE), {}) if i % 3 else ("", {}),
    }


def test_noisy_pages_never_alert_while_real_edits_do(store, agents, settings, site, inbox):
    for path, (body, headers) in noisy_pages(0).items():
        site.set_page(path, body, headers=headers)
        add_users_tracking(store, site.url(path), ["noise@example.org"])
    for path, maker in per_request(seed=7).items():
        site.set_maker(path, maker)
        add_users_tracking(store, site.url(path), ["noise@example.org"])
    site.set_page("/edited", doc(ARTICLE))
    add_users_tracking(store, site.url("/edited"), ["edit@example.org"])
    # A clock on the page, but the tracker watches only the article: real edits still count.
    article = {"text": ARTICLE}  # the clock ticks on every request; the article is edited once
    site.set_maker(
        "/clock-article",
        lambda n, _: {"body": doc(f"<article>{article['text']}</article><p>time {n}</p>")},
    )
    add_users_tracking(store, site.url("/clock-article"), ["part@example.org"], selector="article")
    # The whole page too: its clock is learned as noise, the edit still comes through.
    add_users_tracking(store, site.url("/clock-article"), ["whole@example.org"])
    site.set_page("/status", doc(ARTICLE))
    add_users_tracking(store, site.url("/status"), ["noise@example.org"])
    agents(1, env=agent_env(inbox))

    app = app_settings()
    changed_per_cycle = []
    for i in range(CYCLES):
        for path, (body, headers) in noisy_pages(i).items():
            if path == "/flaky" and not body:
                if i % 2:
                    site.set_page(path, "", content_type="text/html")  # empty body
                else:
                    site.set_page(path, "<html><body> </body></html>")  # blank page
            else:
                site.set_page(path, body, headers=headers)
        # The status page fails with 503/500/404 on some cycles, same content otherwise.
        status = {2: 503, 5: 500, 7: 404}.get(i, 200)
        site.set_page("/status", doc(ARTICLE), status=status)
        if i == 3:  # a real edit, kept: confirmed in the cycle that first sees it
            site.set_page("/edited", doc(ARTICLE.replace("Sat 10-14", "Sat closed")))
        if i == 6:
            article["text"] = ARTICLE.replace("9-17", "8-18")
        result = run_app_cycle(store, settings, app)
        changed_per_cycle.append(result.changed)

    assert inbox.to("noise@example.org") == [], [
        m.text[:300] for m in inbox.to("noise@example.org")
    ]
    assert changed_per_cycle == [0, 0, 0, 1, 0, 0, 2, 0, 0, 0]  # cycle 6: two views
    edit = inbox.to("edit@example.org")
    assert len(edit) == 1
    assert "- Sat 10-14" in edit[0].text and "+ Sat closed" in edit[0].text
    part = inbox.to("part@example.org")
    assert len(part) == 1
    assert "+ Mon-Fri 8-18" in part[0].text
    assert "(seen through article)" in part[0].text
    assert "time" not in part[0].text.split("changed")[1]
    whole = inbox.to("whole@example.org")
    assert len(whole) == 1 and "+ Mon-Fri 8-18" in whole[0].text
