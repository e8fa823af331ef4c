"""``jodl web`` behind a reverse proxy (``JODL_WEB_PROXIES``), through a real proxy.

The real server (waitress) runs as ``jodl web`` on PostgreSQL; a reverse proxy in
front of it adds X-Forwarded-For; clients connect to the proxy from loopback
addresses of their own (127.0.0.2, 127.0.0.3), so each is one client to the app.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import sessionmaker
from webserver import ReverseProxy, WebProcess, client_at, start_web

from crawler_app.users.pages import add_user
from jodl.log import make_engine
from jodl.log.migrate import upgrade

PASSWORD = "correct horse battery"
OWNER = "owner@example.org"
#: Failed logins of one (address, account) pair, and anonymous requests, before a 429.
BURST = 3


@pytest.fixture
def proxied(pg_database: str, tmp_path: Path) -> Iterator[tuple[WebProcess, ReverseProxy]]:
    engine = make_engine(pg_database)
    upgrade(engine)
    with sessionmaker(engine).begin() as s:
        add_user(s, OWNER, PASSWORD)
    engine.dispose()
    web = start_web(
        pg_database,
        tmp_path,
        {
            "JODL_WEB_PROXIES": "1",
            "JODL_WEB_SUBMIT_BURST": str(BURST),
            "JODL_WEB_ANONYMOUS_BURST": str(BURST),
        },
    )
    try:
        with ReverseProxy(web.port) as proxy:
            yield web, proxy
    finally:
        web.stop()


def test_failed_logins_lock_out_only_the_proxied_client_that_made_them(proxied) -> None:
    _web, proxy = proxied
    with client_at("127.0.0.2") as attacker, client_at("127.0.0.3") as owner:
        codes = [
            attacker.get(proxy.url + "/api/pages", auth=(OWNER, "wrong guess")).status_code
            for _ in range(BURST + 1)
        ]
        assert codes == [401] * BURST + [429]
        # The owner, from another address behind the same proxy, is not locked out.
        assert owner.get(proxy.url + "/api/pages", auth=(OWNER, PASSWORD)).status_code == 200


def test_anonymous_rate_limits_count_per_proxied_client(proxied) -> None:
    _web, proxy = proxied
    with client_at("127.0.0.2") as busy, client_at("127.0.0.3") as other:
        codes = [busy.post(proxy.url + "/api/users", json={}).status_code for _ in range(BURST + 1)]
        assert codes == [400] * BURST + [429]  # each request takes a token, then none is left
        assert other.post(proxy.url + "/api/users", json={}).status_code == 400


def test_loopback_only_metrics_are_not_served_to_a_proxied_client(proxied) -> None:
    web, proxy = proxied
    with client_at("127.0.0.2") as visitor:
        assert visitor.get(proxy.url + "/metrics").status_code == 403
    # The proxy itself runs on this machine: a client on loopback through it is still
    # a proxied client.
    assert httpx.get(proxy.url + "/metrics", timeout=30).status_code == 403
    # A scraper on this machine, straight to the server, reads them.
    assert httpx.get(web.url + "/metrics", timeout=30).status_code == 200
