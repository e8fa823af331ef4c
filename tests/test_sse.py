"""The batch event stream over real HTTP: ``jodl web``, real agents, a serving master, the site.

URLs submitted through the API go through the on-demand queue to two agent
processes that fetch the local test site; the stream is read over a real
connection to ``jodl web`` (waitress). Checked: results arrive live and in
commit order, a reconnect with Last-Event-ID gets exactly what it missed, cache
hits answer at once without a fetch (errors are fetched again first), a reset makes
the next submission fetch again, and open streams never block other requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from sqlalchemy.orm import sessionmaker
from webserver import AGENT_ENV, EventStream, ServingMaster, WebProcess, start_web

from crawler_app.users.pages import add_user
from jodl.log import Store
from jodl.settings.config import Settings

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

PASSWORD = "correct horse battery"
#: Seconds the slow page waits before answering: far longer than the fast pages take.
SLOW = 2.5


@dataclass
class System:
    web: WebProcess
    store: Store
    site: TestSite

    def submit(self, urls: list[str]) -> dict[str, object]:
        # Signed in: the allowlisted loopback site serves signed-in users only.
        r = httpx.post(
            self.web.url + "/api/batches",
            json={"urls": urls},
            auth=("user@example.org", PASSWORD),
            timeout=30,
        )
        assert r.status_code == 201, r.text
        data: dict[str, object] = r.json()
        return data

    def stream(self, batch: dict[str, object], last_event_id: str | None = None) -> EventStream:
        return EventStream(self.web.url + str(batch["events"]), last_event_id)


@pytest.fixture
def system(
    store: Store,
    settings: Settings,
    agents: Callable[..., object],
    site: TestSite,
    tmp_path: Path,
) -> Iterator[System]:
    agents(2, slots=4, env=AGENT_ENV)
    with sessionmaker(store.engine).begin() as s:
        add_user(s, "user@example.org", PASSWORD)
    master = ServingMaster(settings, store).start()
    web = start_web(
        str(store.engine.url.render_as_string(hide_password=False)),
        tmp_path,
        {
            "JODL_WEB_CACHE_TTL": "3600",
            "JODL_WEB_REFRESH_FRACTION": "0",
            "JODL_WEB_STREAM_POLL": "0.05",
            "JODL_WEB_THREADS": "6",
            "JODL_WEB_MAX_STREAMS": "3",
        },
    )
    try:
        yield System(web, store, site)
    finally:
        web.stop()
        master.stop()


def page(title: str, text: str) -> str:
    return f"<html><head><title>{title}</title></head><body><p>{text}</p></body></html>"


def test_results_stream_live_in_completion_order_and_resume(system: System) -> None:
    site = system.site
    site.set_page("/slow", page("Slow", "waited for"), delay=SLOW)
    site.set_page("/a", page("Page A", "alpha text"))
    site.set_page("/b", page("Page B", "beta text"), delay=SLOW / 2)
    site.set_page("/gone", "nothing here", status=404)
    urls = [
        site.url("/slow"),
        site.url("/a"),
        "file:///etc/passwd",
        site.url("/b"),
        site.url("/gone"),
    ]
    batch = system.submit(urls)
    answers = [i["answer"] for i in batch["items"]]  # type: ignore[index]
    assert answers == ["queued", "queued", "refused", "queued", "queued"]
    with system.stream(batch) as stream:
        events = list(stream)
    assert [e.event for e in events] == ["result"] * 5 + ["complete"]
    results = [e.json() for e in events[:-1]]
    by_pos = {r["position"]: r for r in results}
    assert sorted(by_pos) == [0, 1, 2, 3, 4]
    # The refused URL first (answered at submission); then as the pages finish: the
    # instant ones (a, gone), then b (waits SLOW/2), then the slow page (waits SLOW).
    order = [r["position"] for r in results]
    assert order[0] == 2 and "scheme" in results[0]["error"]
    assert set(order[1:3]) == {1, 4} and order[3:] == [3, 0]
    # Live: each event reached us before the next slower page had been answered.
    b_done = site.wait_requests("/b")[0].finished
    slow_done = site.wait_requests("/slow")[0].finished
    assert max(e.received for e in events[1:3]) < b_done
    assert events[3].received < slow_done
    a = by_pos[1]
    assert a["ok"] and a["status"] == 200 and a["title"] == "Page A"
    assert a["excerpt"] == "alpha text" and len(a["fingerprint"]) == 64 and a["cached"] is False
    assert a["final_url"] == site.url("/a") and a["size"] > 0 and a["changed"] is None
    gone = by_pos[4]
    assert not gone["ok"] and gone["status"] == 404 and "404" in gone["error"]
    # Every event id is a cursor; the last names all five positions.
    assert events[-1].id == events[-2].id and events[-1].json() == {"total": 5}

    # Resume: take two events, drop the connection, come back with the last id seen.
    again = system.submit([site.url("/c1"), site.url("/c2"), site.url("/c3")])
    for p in ("/c1", "/c2", "/c3"):
        site.set_page(p, page(p, "text of " + p), delay=0.3 if p == "/c3" else 0.0)
    with system.stream(again) as stream:
        first = [stream.next(), stream.next()]
    assert all(e is not None and e.event == "result" for e in first)
    seen = {e.json()["position"] for e in first if e is not None}
    status = lambda: httpx.get(system.web.url + str(again["self"])).json()  # noqa: E731
    site.wait_for(lambda: status()["complete"], timeout=30)
    with system.stream(again, last_event_id=first[-1].id) as stream:  # type: ignore[union-attr]
        rest = list(stream)
    assert [e.event for e in rest] == ["result", "complete"]
    assert seen | {rest[0].json()["position"]} == {0, 1, 2}
    # A reconnect after the end gets just the end.
    with system.stream(again, last_event_id=rest[-1].id) as stream:
        assert [e.event for e in stream] == ["complete"]


def test_cache_hits_requeued_errors_and_reset(system: System) -> None:
    site = system.site
    site.set_page("/p", page("P", "first version"))
    site.set_page("/err", "down", status=503)
    urls = [site.url("/p"), site.url("/err")]
    with system.stream(system.submit(urls)) as stream:
        first = [e.json() for e in stream if e.event == "result"]
    assert {r["cached"] for r in first} == {False}
    assert len(site.requests("/p")) == 1 and len(site.requests("/err")) == 1

    # Again, the error lifted meanwhile: the good result answers from the cache at
    # once; the error is fetched again and its fresh result answers, not the old one.
    site.set_page("/err", page("Err", "back up"))
    batch = system.submit(urls)
    assert batch["cached"] == 1 and batch["queued"] == 1
    with system.stream(batch) as stream:
        events = list(stream)
    results = [e.json() for e in events if e.event == "result"]
    assert [(r["position"], r["cached"]) for r in results] == [(0, True), (1, False)]
    assert [r["excerpt"] for r in results] == ["first version", "back up"]
    assert events[-1].event == "complete"
    assert len(site.requests("/err")) == 2
    jobs = httpx.get(
        system.web.url + "/api/admin/status", auth=("user@example.org", PASSWORD)
    ).status_code
    assert jobs == 403  # not an operator
    assert len(site.requests("/p")) == 1  # the good result was not fetched again

    # Reset /p: the next submission fetches it again and sees the new text.
    site.set_page("/p", page("P", "second version"))
    r = httpx.post(
        system.web.url + "/api/reset",
        json={"urls": [site.url("/p")]},
        auth=("user@example.org", PASSWORD),
    )
    assert r.status_code == 200 and r.json()["forgotten"] == [site.url("/p")]
    anonymous = httpx.post(system.web.url + "/api/reset", json={"urls": [site.url("/p")]})
    assert anonymous.status_code == 401
    batch = system.submit([site.url("/p")])
    assert batch["cached"] == 0 and batch["queued"] == 1
    with system.stream(batch) as stream:
        (result,) = [e.json() for e in stream if e.event == "result"]
    assert result["cached"] is False and result["excerpt"] == "second version"
    assert len(site.requests("/p")) == 2


def test_open_streams_never_block_other_requests(system: System) -> None:
    site = system.site
    site.set_page("/hang", page("Hang", "late"), delay=20)
    batch = system.submit([site.url("/hang")])
    streams = [system.stream(batch) for _ in range(3)]  # JODL_WEB_MAX_STREAMS=3 of 6 threads
    try:
        for _ in range(5):
            assert httpx.get(system.web.url + "/healthz", timeout=5).status_code == 200
            assert httpx.get(system.web.url + "/", timeout=5).status_code == 200
        # A fourth stream is told to come back later instead of taking a thread.
        with system.stream(batch) as busy:
            assert list(busy) == [] and busy.retry == 3000
    finally:
        for s in streams:
            s.close()
