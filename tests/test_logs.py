"""Logs for machines: JODL_LOG_FORMAT=json gives one JSON object per record."""

from __future__ import annotations

import json

from agents import run_jodl


def test_json_log_lines_carry_role_run_and_family(store, agents, db_url) -> None:
    (agent,) = agents(1, slots=2)
    fam = store.ensure_family("noop")
    store.add_jobs(fam, ((f"k{i}", "{}") for i in range(20)))
    result = run_jodl(
        "run",
        "noop",
        env={
            "JODL_DATABASE_URL": db_url,
            "JODL_LOG_FORMAT": "json",
            "JODL_LOG_LEVEL": "INFO",
            "JODL_METRICS_LISTEN": "",
        },
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert records, result.stderr
    for record in records:
        assert {"time", "level", "role", "logger", "message"} <= record.keys()
        assert record["role"] == "master"
    opened = [r for r in records if "opened" in r["message"]]
    assert opened and opened[0]["family"] == "noop" and isinstance(opened[0]["run_id"], int)
    finished = [r for r in records if "20/20 done" in r["message"]]
    assert finished and finished[0]["run_id"] == opened[0]["run_id"]
    connected = [r for r in records if "connected" in r["message"]]
    assert connected and connected[0]["node"] == agent.address
    # Every line on stderr that is a log record is JSON (no text lines mixed in).
    assert not [line for line in result.stderr.splitlines() if " INFO " in line]
