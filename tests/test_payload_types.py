"""Payload types per family: a family's pydantic model checks jobs where they are added
(the library, the command, the queue, the HTTP API: a bad one refused with its index or
line, nothing added) and gives ``run`` the parsed object on a real agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from agents import run_jodl
from flask import Flask
from test_web_api import OPS, make_app

import jodl
from jodl.exceptions import BadPayload
from jodl.log import Store
from jodl.master import Master
from jodl.queue import Queue
from jodl.settings.config import Settings

GOOD = {"w": 2, "h": 3}


def test_the_library_refuses_a_bad_payload_by_index_and_adds_nothing(db_url: str) -> None:
    with pytest.raises(BadPayload) as refused:
        jodl.add_jobs(
            "area", {"a": GOOD, "b": {"w": 0, "h": 1}, "c": {"w": 1}}, database_url=db_url
        )
    said = str(refused.value)
    assert "jobs[1] (key 'b'): w: Input should be greater than 0" in said
    assert "jobs[2] (key 'c'): h: Field required" in said
    store = jodl.connect(db_url)
    try:
        assert store.family("area") is None  # nothing added, not even the family
        assert jodl.add_jobs("area", {"a": GOOD}, database_url=db_url) == 1
    finally:
        store.engine.dispose()


def test_the_command_names_the_bad_line(tmp_path: Path, db_url: str) -> None:
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(
        '{"key": "a", "payload": {"w": 1, "h": 1}}\n'
        '{"key": "b", "payload": {"w": 1, "h": 1, "d": 3}}\n'
        '{"key": "c", "payload": {"w": "wide", "h": 1}}\n'
    )
    env = {"JODL_DATABASE_URL": db_url}
    out = run_jodl("jobs", "add", "area", "--from", str(lines), env=env)
    assert out.returncode != 0
    assert "line 2: d: Extra inputs are not permitted" in out.stderr
    assert "line 3: w: Input should be a valid integer" in out.stderr
    one = run_jodl("jobs", "add", "area", "--payload", '{"w": -1, "h": 1}', env=env)
    assert one.returncode != 0 and "w: Input should be greater than 0" in one.stderr
    store = jodl.connect(db_url)
    try:
        assert store.family("area") is None
    finally:
        store.engine.dispose()


def test_the_queue_refuses_a_bad_payload(store: Store) -> None:
    queue = Queue(store.engine)
    with pytest.raises(BadPayload, match="job 'q2': h: Field required"):
        queue.enqueue_many("area", [("q1", GOOD), ("q2", {"w": 1})])
    assert queue.get("area", "q1") is None
    queue.enqueue_many("area", [("q1", GOOD)])
    assert queue.get("area", "q1") is not None


def test_the_http_api_refuses_a_bad_payload_by_index(tmp_path: Path) -> None:
    app: Flask = make_app(tmp_path)
    try:
        client = app.test_client()
        bad = client.post(
            "/api/families/area/jobs",
            json={"jobs": [{"key": "a", "payload": GOOD}, {"key": "b", "payload": {"w": 1}}]},
            headers=OPS,
        )
        assert bad.status_code == 400
        assert "jobs[1] (key 'b'): h: Field required" in str(bad.get_json())
        assert Store(app.extensions["jodl"].engine).family("area") is None
    finally:
        app.extensions["jodl"].engine.dispose()


def test_a_real_agent_runs_the_parsed_payload_and_refuses_one_that_got_past(
    store: Store, settings: Settings, agents: object
) -> None:
    agents(1, slots=2)  # type: ignore[operator]
    # One job checked where it was added, one written to the log behind the check's back.
    jodl.add_jobs("area", {"ok": {"w": 4, "h": 5}}, store=store)
    store.add_jobs("area", {"sneaked": {"w": -4, "h": 5}})
    master = Master(settings.replace(max_attempts=3), store=store)
    try:
        summary = master.run_cycle("area")
    finally:
        master.close()
    assert (summary.done, summary.dead) == (1, 1)
    by_key = {job.key: job for job in store.results("area")}
    assert by_key["ok"].result == {"pixels": 20}  # run got a Size, not a dict
    assert "w: Input should be greater than 0" in (by_key["sneaked"].error or "")
    # Refused once, not retried: a payload the model refuses is permanent.
    attempts = store.reads.run_executions(summary.run_id, key="sneaked")
    assert [e.state for e in attempts] == ["failed"]
