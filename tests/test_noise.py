"""Dynamic noise never alerts over ten cycles, while real edits do, exactly once each."""

from __future__ import annotations

from app_support import add_users_tracking, agent_env, app_settings, inbox, run_app_cycle

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest

CYCLES = 10
ARTICLE = "<h1>Opening hours</h1><p>Mon-Fri 9-17</p><p>Sat 10-14</p>"


def doc(body: str, head: str = "") -> str:
    return f"<html><head><title>Shop</title>{head}</head><body>{body}</body></html>"


def noisy_pages(i: int) -> dict[str, tuple[str, dict[str, str]]]:
    """What each noisy path serves in cycle ``i`` (body, headers)."""
    banners = ["Sale on shoes", "New: umbrellas", "Free delivery"]
    return {
        # A clock and a visit counter: new text on every fetch.
        "/clock": (doc(f"{ARTICLE}<p>Server time 12:{i:02d}:{(i * 7) % 60:02d}</p>"), {}),
        "/counter": (doc(f"{ARTICLE}<footer>{1000 + i * 37} visits</footer>"), {}),
        # Tokens in scripts, styles, attributes: invisible, with a new ETag each time.
        "/tokens": (
            doc(
                f'{ARTICLE}<form><input type=hidden name=csrf value="tok{i}"></form>'
                f"<script>window.nonce = 'n{i}';</script>",
                head=f'<meta name="csrf-token" content="c{i}"><style>.x{i} {{}}</style>',
            ),
            {"ETag": f'"tokens-{i}"'},
        ),
        # A rotating block: one of three banners in turn.
        "/rotating": (doc(f"<div class=banner>{banners[i % 3]}</div>{ARTICLE}"), {}),
        # A page flipping between two states (A/B test).
        "/flip": (doc(ARTICLE + ("<p>Variant A</p>" if i % 2 else "<p>Variant B</p>")), {}),
        # Errors, empty bodies and blank pages in between the same content.
        "/flaky": (doc(ARTICLE), {}) if i % 3 else ("", {}),
    }


def test_noisy_pages_never_alert_while_real_edits_do(store, agents, settings, site, inbox):
    noisy = noisy_pages(0)
    for path, (body, headers) in noisy.items():
        site.set_page(path, body, headers=headers)
        add_users_tracking(store, site.url(path), ["noise@example.org"])
    site.set_page("/edited", doc(ARTICLE))
    add_users_tracking(store, site.url("/edited"), ["edit@example.org"])
    # A clock on the page, but the tracker watches only the article: real edits still count.
    site.set_page("/clock-article", doc(f"<article>{ARTICLE}</article><p>time 0</p>"))
    add_users_tracking(store, site.url("/clock-article"), ["part@example.org"], selector="article")
    add_users_tracking(store, site.url("/clock-article"), ["noise@example.org"])
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
        if i == 3:  # a real edit, kept: confirmed on the next cycle
            site.set_page("/edited", doc(ARTICLE.replace("Sat 10-14", "Sat closed")))
        article = ARTICLE.replace("9-17", "8-18") if i >= 6 else ARTICLE
        site.set_page("/clock-article", doc(f"<article>{article}</article><p>time {i}</p>"))
        result = run_app_cycle(store, settings, app)
        changed_per_cycle.append(result.changed)

    assert inbox.to("noise@example.org") == [], [m.text for m in inbox.to("noise@example.org")]
    assert changed_per_cycle == [0, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    edit = inbox.to("edit@example.org")
    assert len(edit) == 1
    assert "- Sat 10-14" in edit[0].text and "+ Sat closed" in edit[0].text
    part = inbox.to("part@example.org")
    assert len(part) == 1
    assert "+ Mon-Fri 8-18" in part[0].text
    assert "(the part matching article)" in part[0].text
    assert "time" not in part[0].text.split("changed")[1]
