"""Traces (OpenTelemetry, the optional ``[otel]`` extra): one trace per job.

This module is the only one that touches OpenTelemetry, and it imports it only when
traces are turned on (``JODL_TRACES``, or :func:`use_exporter` in tests): with
traces off nothing of OpenTelemetry is loaded and the callers' only cost is a test
of :data:`state.on` per batch, never per job.

A job's spans share one trace without anything stored: its trace id is derived from
the job's database id, and so are the ids of the spans others hang on
(docs/operations.md#traces)::

    jodl.add       root of the job's trace           span id from the job id
    jodl.dispatch  child of jodl.add (master)        span id from the execution id
    jodl.run       child of jodl.dispatch (agent)    context carried in the send batch
    jodl.commit    child of jodl.dispatch (master)   when the log writer committed it

Spans of the tracer ``jodl`` go to our own tracer provider (the process's global one,
if any, is left alone), whose id generator hands out these derived ids when asked
to. The agent learns a dispatch span's context from the ``traceparent`` (W3C) the
master adds to each job of a ``send`` batch, only while traces are on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from ..exceptions import ConfigError

#: The values of JODL_TRACES besides ``file:PATH`` (JSON lines, for tests and debugging).
KINDS = ("none", "console", "otlp")
#: The tracer's name (instrumentation scope).
TRACER = "jodl"


def parse(text: str) -> str:
    """A valid JODL_TRACES value, normalised; ValueError otherwise."""
    spec = text.strip()
    if spec.lower() in KINDS or spec == "":
        return spec.lower() or "none"
    if spec.startswith("file:") and len(spec) > len("file:"):
        return spec
    raise ValueError(f"expected none, console, otlp or file:PATH, got {text!r}")


class _State:
    """Whether traces are on, and the tracer then (set once per process, see configure)."""

    def __init__(self) -> None:
        self.on = False
        self.configured = False
        self.tracer: Any = None
        self.provider: Any = None
        self.ids: Any = None
        self.lock = threading.Lock()


#: Read by the callers before any tracing work: ``if state.on: ...``.
state = _State()


# -- ids ------------------------------------------------------------------------------------


def _digest(kind: bytes, number: int, size: int) -> int:
    digest = hashlib.blake2b(b"jodl-%s:%d" % (kind, number), digest_size=size).digest()
    value = int.from_bytes(digest)
    return value or 1  # an id of zeros is invalid


def trace_id(job_id: int) -> int:
    """The trace id of job ``job_id`` (16 bytes)."""
    return _digest(b"job", job_id, 16)


def add_span_id(job_id: int) -> int:
    """The span id of the job's ``jodl.add`` span (8 bytes), its trace's root."""
    return _digest(b"add", job_id, 8)


def dispatch_span_id(exec_id: int) -> int:
    """The span id of execution ``exec_id``'s ``jodl.dispatch`` span (8 bytes)."""
    return _digest(b"dispatch", exec_id, 8)


def traceparent(job_id: int, exec_id: int) -> str:
    """The W3C traceparent of execution ``exec_id`` of job ``job_id`` (its dispatch span)."""
    return f"00-{trace_id(job_id):032x}-{dispatch_span_id(exec_id):016x}-01"


def parse_traceparent(text: str) -> tuple[int, int] | None:
    """(trace id, span id) of a W3C traceparent; None if it is not one."""
    parts = text.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace, span = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return (trace, span) if trace and span else None


# -- set-up ---------------------------------------------------------------------------------


def configure(spec: str | None = None) -> bool:
    """Turn traces on as ``spec`` says (None: the JODL_TRACES variable); whether they are on.

    The first configuration of a process wins (a test's :func:`use_exporter` stays
    when the master it starts configures from its settings). :class:`ConfigError`
    naming the extra when traces are asked for and OpenTelemetry is not installed.
    """
    with state.lock:
        if state.configured:
            return state.on
        try:
            kind = parse(os.environ.get("JODL_TRACES", "none") if spec is None else spec)
        except ValueError as exc:
            raise ConfigError(f"JODL_TRACES: {exc}") from None
        if kind != "none":
            try:
                _start(_exporter(kind), batch=kind == "otlp")
            except ImportError as exc:
                raise ConfigError(
                    f"JODL_TRACES={kind} needs OpenTelemetry: pip install 'jodl[otel]' ({exc})"
                ) from None
        state.configured = True
        return state.on


def use_exporter(exporter: Any) -> None:
    """Send every span to ``exporter`` (an OpenTelemetry ``SpanExporter``), at once."""
    with state.lock:
        _start(exporter, batch=False)
        state.configured = True


def shutdown() -> None:
    """Flush and stop the exporter; traces are off and may be configured again."""
    with state.lock:
        if state.provider is not None:
            state.provider.shutdown()
        state.on = False
        state.configured = False
        state.tracer = state.provider = state.ids = None


def _exporter(kind: str) -> Any:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # the endpoint from OTEL_EXPORTER_OTLP_* variables
    return _json_lines_exporter(kind.removeprefix("file:"))


def _start(exporter: Any, batch: bool) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if state.provider is not None:
        state.provider.shutdown()
    state.ids = _derived_ids()
    state.provider = TracerProvider(id_generator=state.ids)
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    state.provider.add_span_processor(processor)
    state.tracer = state.provider.get_tracer(TRACER)
    state.on = True


def _derived_ids() -> Any:
    """An id generator that hands out the ids :func:`_span` asks for, random ones else."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class DerivedIds(RandomIdGenerator):
        def __init__(self) -> None:
            self.next = threading.local()

        def generate_span_id(self) -> int:
            span_id = getattr(self.next, "span_id", 0)
            if span_id:
                self.next.span_id = 0
                return span_id
            return super().generate_span_id()

        def generate_trace_id(self) -> int:
            trace = getattr(self.next, "trace_id", 0)
            if trace:
                self.next.trace_id = 0
                return trace
            return super().generate_trace_id()

    return DerivedIds()


def _json_lines_exporter(path: str) -> Any:
    """A ``SpanExporter`` appending one JSON object per span to ``path`` (tests, debugging)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLines(SpanExporter):
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def export(self, spans: Sequence[Any]) -> Any:
            lines = "".join(json.dumps(span_record(s)) + "\n" for s in spans)
            with self.lock, open(path, "a", encoding="utf-8") as fh:
                fh.write(lines)
            return SpanExportResult.SUCCESS

    return JsonLines()


def span_record(span: Any) -> dict[str, Any]:
    """A finished span as plain values: name, ids (hex), parent, status, attributes."""
    ctx = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "start": span.start_time,
        "end": span.end_time,
    }


# -- spans ----------------------------------------------------------------------------------


def _span(
    name: str,
    trace: int,
    span_id: int,
    parent: int | None,
    attributes: dict[str, Any],
    start: int | None = None,
    links: Sequence[Any] = (),
) -> Any:
    """Start span ``name`` with the given ids (``parent`` None: a root of ``trace``)."""
    from opentelemetry import trace as api

    ids = state.ids
    if span_id:
        ids.next.span_id = span_id
    context = None
    if parent is None:
        ids.next.trace_id = trace
        context = api.set_span_in_context(api.INVALID_SPAN)
    else:
        parent_ctx = api.SpanContext(
            trace, parent, is_remote=True, trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED)
        )
        context = api.set_span_in_context(api.NonRecordingSpan(parent_ctx))
    try:
        return state.tracer.start_span(
            name, context=context, attributes=attributes, start_time=start, links=list(links)
        )
    finally:
        ids.next.span_id = ids.next.trace_id = 0


def added(family: str, jobs: Iterable[tuple[str, int]], what: str = "add_jobs") -> None:
    """An add call's span ``jodl.add`` (its own trace), and one ``jodl.add`` span per job
    (key, job id) rooting the job's trace, linked to the call's."""
    from opentelemetry import trace as api

    now = time.time_ns()
    jobs = list(jobs)
    call = state.tracer.start_span(
        "jodl.add",
        context=api.set_span_in_context(api.INVALID_SPAN),
        attributes={"jodl.family": family, "jodl.jobs": len(jobs), "jodl.call": what},
        start_time=now,
    )
    link = [api.Link(call.get_span_context())]
    for key, job_id in jobs:
        attrs = {"jodl.family": family, "jodl.key": key, "jodl.job_id": job_id}
        _span("jodl.add", trace_id(job_id), add_span_id(job_id), None, attrs, now, link).end()
    call.end()


class SentJob(NamedTuple):
    """One execution sent to an agent, as its ``jodl.dispatch`` span describes it."""

    exec_id: int
    job_id: int
    family: str
    key: str
    attempt: int


def carriers(jobs: Iterable[SentJob]) -> list[tuple[int, str, int, str]]:
    """What the agent's ``jodl.run`` spans need of ``jobs``: (exec_id, traceparent,
    attempt, key) each (sent framed, :func:`jodl.agent.codec.encode_traces`)."""
    return [(j.exec_id, traceparent(j.job_id, j.exec_id), j.attempt, j.key) for j in jobs]


def dispatched(node: str, jobs: Iterable[SentJob], start: int, error: str | None = None) -> None:
    """One ``jodl.dispatch`` span per job sent to ``node``, from ``start`` (ns) until now;
    ``error``: the send call failed."""
    from opentelemetry.trace import Status, StatusCode

    for exec_id, job_id, family, key, attempt in jobs:
        attrs = {
            "jodl.family": family,
            "jodl.key": key,
            "jodl.job_id": job_id,
            "jodl.exec_id": exec_id,
            "jodl.node": node,
            "jodl.attempt": attempt,
        }
        span = _span(
            "jodl.dispatch",
            trace_id(job_id),
            dispatch_span_id(exec_id),
            add_span_id(job_id),
            attrs,
            start,
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()


def committed(rows: Iterable[Any], start: int) -> None:
    """One ``jodl.commit`` span per execution row committed (``id``, ``job_id``,
    ``attempt``, ``state``, ``error``), from ``start`` (ns) until now."""
    from opentelemetry.trace import Status, StatusCode

    for row in rows:
        attrs = {
            "jodl.exec_id": row.id,
            "jodl.job_id": row.job_id,
            "jodl.attempt": row.attempt,
            "jodl.outcome": row.state,
        }
        span = _span("jodl.commit", trace_id(row.job_id), 0, dispatch_span_id(row.id), attrs, start)
        if row.error:
            span.set_status(Status(StatusCode.ERROR, str(row.error)[:200]))
        span.end()


@contextlib.contextmanager
def run_span(carrier: str, attributes: dict[str, Any]) -> Iterator[None]:
    """The agent's ``jodl.run`` span of one execution, child of the span ``carrier``
    (a traceparent) names, current while the family runs (its own spans join it).

    Its outcome is ``done``, or ``failed`` with the error when an exception escapes
    the block (the span's status is then an error; the exception goes on).
    """
    from opentelemetry import trace as api
    from opentelemetry.trace import Status, StatusCode

    ids = parse_traceparent(carrier)
    if ids is None:
        yield
        return
    span = _span("jodl.run", ids[0], 0, ids[1], attributes)
    try:
        with api.use_span(span, end_on_exit=False, record_exception=False):
            yield
        span.set_attribute("jodl.outcome", "done")
    except BaseException as exc:
        span.set_attribute("jodl.outcome", "failed")
        span.set_attribute("jodl.error", f"{type(exc).__name__}: {exc}"[:500])
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200]))
        raise
    finally:
        span.end()


__all__ = [
    "KINDS",
    "TRACER",
    "SentJob",
    "add_span_id",
    "added",
    "carriers",
    "committed",
    "configure",
    "dispatch_span_id",
    "dispatched",
    "parse",
    "parse_traceparent",
    "run_span",
    "shutdown",
    "span_record",
    "state",
    "trace_id",
    "traceparent",
    "use_exporter",
]
