"""Traces (``[otel]`` extra): one trace per job across add, dispatch, the agent's run
and the commit, with a real master here and real agent processes (docs/operations.md#traces).

The master's spans go to the SDK's in-memory exporter; each agent writes its spans
as JSON lines (``JODL_TRACES=file:PATH``) that the test reads back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from agents import child_env

import jodl
from jodl.exceptions import ConfigError
from jodl.log import Store
from jodl.master import Master
from jodl.obs import tracing
from jodl.queue import Queue
from jodl.settings.config import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    """Traces on in this process, into memory; off again afterwards. Skipped without
    the [otel] extra (the tests of traces off run either way)."""
    pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra is not installed")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing.shutdown()
    tracing.use_exporter(exporter)
    yield exporter
    tracing.shutdown()


def master_spans(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [tracing.span_record(s) for s in exporter.get_finished_spans()]


def agent_spans(paths: list[Path]) -> list[dict[str, Any]]:
    lines = [line for p in paths if p.exists() for line in p.read_text().splitlines()]
    return [json.loads(line) for line in lines]


def of_job(spans: list[dict[str, Any]], name: str, job_id: int) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name and s["attributes"].get("jodl.job_id") == job_id]


def test_one_trace_per_job_from_add_to_commit(
    store: Store, agents: Any, settings: Settings, memory: InMemorySpanExporter, tmp_path: Path
) -> None:
    files = [tmp_path / f"agent-{i}.jsonl" for i in range(2)]
    for path in files:
        agents(1, slots=2, env={"JODL_TRACES": f"file:{path}"})
    added = jodl.add_jobs("noop", {f"n{i}": {} for i in range(5)}, store=store, create=True)
    store.ensure_family("fail", max_attempts=2)
    jodl.add_jobs("fail", {"bad": {"message": "boom"}}, store=store)
    master = Master(settings, store=store)
    try:
        assert master.run_cycle("noop").done == added == 5
        assert master.run_cycle("fail").dead == 1
    finally:
        master.close()

    mine, theirs = master_spans(memory), agent_spans(files)
    calls = [s for s in mine if s["name"] == "jodl.add" and "jodl.job_id" not in s["attributes"]]
    assert sorted(s["attributes"]["jodl.family"] for s in calls) == ["fail", "noop"]
    job_ids = {s["attributes"]["jodl.job_id"] for s in mine if s["name"] == "jodl.dispatch"}
    assert len(job_ids) == 6
    for job_id in job_ids:
        (add,) = of_job(mine, "jodl.add", job_id)
        dispatches = of_job(mine, "jodl.dispatch", job_id)
        commits = of_job(mine, "jodl.commit", job_id)
        trace = add["trace_id"]
        assert trace == f"{tracing.trace_id(job_id):032x}"
        assert add["parent_id"] is None, "the add span roots the job's trace"
        assert dispatches and len(commits) == len(dispatches), [c["attributes"] for c in commits]
        for dispatch in dispatches:  # backup copies too (a straggler's second copy)
            assert dispatch["trace_id"] == trace and dispatch["parent_id"] == add["span_id"]
            exec_id = dispatch["attributes"]["jodl.exec_id"]
            (commit,) = [s for s in commits if s["attributes"]["jodl.exec_id"] == exec_id]
            assert commit["trace_id"] == trace and commit["parent_id"] == dispatch["span_id"]
            runs = [s for s in theirs if s["attributes"]["jodl.exec_id"] == exec_id]
            if commit["attributes"]["jodl.outcome"] in ("done", "failed"):
                assert len(runs) == 1, "the agent ran it"
            for run in runs:  # a copy cancelled while it ran has a run span, or none
                assert run["name"] == "jodl.run"
                assert run["trace_id"] == trace, "the context crossed the wire"
                assert run["parent_id"] == dispatch["span_id"]
                assert run["attributes"]["jodl.key"] == dispatch["attributes"]["jodl.key"]
                assert run["attributes"]["jodl.attempt"] == dispatch["attributes"]["jodl.attempt"]
        family = dispatches[0]["attributes"]["jodl.family"]
        runs = [s for s in theirs if s["trace_id"] == trace]
        outcomes = [s["attributes"]["jodl.outcome"] for s in commits]
        if family == "fail":
            assert sorted(outcomes) == ["failed", "failed"]
            assert len(runs) == 2, "two attempts, two runs in the job's one trace"
            assert {s["status"] for s in runs} == {"ERROR"}
            assert all("boom" in s["attributes"]["jodl.error"] for s in runs)
            assert {s["attributes"]["jodl.outcome"] for s in runs} == {"failed"}
        else:
            assert outcomes.count("done") == 1
            assert runs and {s["status"] for s in runs} == {"UNSET"}
            assert {s["attributes"]["jodl.outcome"] for s in runs} == {"done"}


def test_an_enqueued_job_starts_its_trace(store: Store, memory: InMemorySpanExporter) -> None:
    (job_id,) = Queue(store).enqueue_many("noop", ["q1"])
    (add,) = of_job(master_spans(memory), "jodl.add", job_id)
    assert add["trace_id"] == f"{tracing.trace_id(job_id):032x}"
    assert add["span_id"] == f"{tracing.add_span_id(job_id):016x}"


def test_traces_off_load_nothing_of_opentelemetry(tmp_path: Path) -> None:
    """A whole cycle on an in-process agent, an add and an enqueue without JODL_TRACES."""
    script = textwrap.dedent(
        f"""
        import sys
        import jodl
        from jodl.agent import start_agent
        from jodl.log import Store
        from jodl.master import Master
        from jodl.queue import Queue
        from jodl.settings.config import Settings

        url = "sqlite:///{tmp_path / "off.db"}"
        store = jodl.connect(url)
        jodl.add_jobs("noop", {{"a": {{}}, "b": {{}}}}, store=store, create=True)
        Queue(store).enqueue("noop", "c")
        settings = Settings.from_env(database_url=url)
        start_agent(settings.replace(secret=None), "local:1")
        store.add_node("local:1", slots=2)
        master = Master(settings, store=store)
        assert master.run_cycle("noop").done == 2
        master.close()
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env({"JODL_TRACES": None, "JODL_SECRET": None}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("value", ["none", "console", "otlp", "file:/tmp/x.jsonl", " OTLP "])
def test_the_setting_takes_its_values(value: str) -> None:
    assert Settings.from_env({"JODL_TRACES": value}).traces == tracing.parse(value)


@pytest.mark.parametrize("value", ["jaeger", "file:", "yes"])
def test_a_wrong_setting_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="JODL_TRACES"):
        Settings.from_env({"JODL_TRACES": value})


def test_traces_asked_for_without_the_extra_name_it(monkeypatch: pytest.MonkeyPatch) -> None:
    tracing.shutdown()
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    try:
        with pytest.raises(ConfigError, match=r"JODL_TRACES=console needs .*jodl\[otel\]"):
            tracing.configure("console")
        assert not tracing.state.on
    finally:
        tracing.shutdown()
