"""``jodl jobs add|delete``, ``jodl results``, ``jodl run`` and ``jodl master``: jobs and cycles."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

from ..exceptions import BadPayload, JodlError
from .context import settings_of, sigterm_sets, store_of
from .progress import progress_reporters


@click.group()
def jobs() -> None:
    """Add and list jobs of families."""


@jobs.command("add")
@click.argument("family")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Number of jobs.")
@click.option("--payload", default=None, help="JSON object given to every job.")
@click.option("--key-prefix", default="job-", help="Keys are PREFIX0, PREFIX1, ...")
@click.option(
    "--from",
    "from_file",
    type=click.File("rb"),
    default=None,
    help='JSON Lines file: one {"key": ..., "payload": {...}} per line ("-": stdin).',
)
@click.option("--strategy", default=None, help="Placement strategy of a new family.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=None)
@click.pass_context
def jobs_add(
    ctx: click.Context,
    family: str,
    count: int | None,
    payload: str | None,
    key_prefix: str,
    from_file: Any,
    strategy: str | None,
    max_attempts: int | None,
) -> None:
    """Add jobs to FAMILY: COUNT with one payload, or each line of a JSON Lines file.

    All or nothing: a bad line is reported with its number and no job is added.
    Keys the family already has are kept.
    """
    from .. import family as families

    families.load(family)  # refuse an unknown family before writing anything
    check = families.payload_checker(family)
    rows: list[tuple[str, Any]] = []
    lines: bytes | None = None
    if from_file is not None:
        if count is not None or payload is not None:
            raise click.BadParameter("give --from, or --count/--payload", param_hint="--from")
        lines = from_file.read()
        if check is not None:  # its payloads are checked in Python: the lines read here
            rows, lines = _read_jobs(_text(lines), check, from_file.name), None
    else:
        payload = payload or "{}"
        from ..agent.codec import loads_object

        try:
            parsed = loads_object(payload)
            if check is not None:
                check(parsed)
        except BadPayload as exc:
            raise click.BadParameter(str(exc), param_hint="--payload") from None
        rows = [(f"{key_prefix}{i}", payload) for i in range(count or 1)]
    store = store_of(ctx)
    fields: dict[str, Any] = {}
    if strategy:
        from ..placement import strategy as make_strategy

        try:
            make_strategy(strategy)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--strategy") from None
        fields["strategy"] = strategy
    if max_attempts:
        fields["max_attempts"] = max_attempts
    if lines is not None:
        # PostgreSQL parses the lines; they are read here where it does not, or refuses
        # them: to name the bad ones.
        done = store.add_job_lines(family, lines, **fields)
        if done is not None:
            _say_added(family, done.added, done.given)
            return
        rows = _read_jobs(_text(lines), None, from_file.name)
    fam = store.ensure_family(family, **fields)
    _say_added(family, store.add_jobs(fam, rows), len(rows))


def _text(lines: bytes) -> io.TextIOWrapper:
    """``lines`` as the text of a file opened to read (UTF-8, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(lines), encoding="utf-8")


def _say_added(family: str, added: int, given: int) -> None:
    kept = given - added
    click.echo(f"{added} jobs added to {family}" + (f" ({kept} keys existed)" if kept else ""))


#: Bad lines of a jobs file named in the error at most.
BAD_LINES_SHOWN = 5


def _read_jobs(
    fh: Any, check: Callable[[dict[str, Any]], Any] | None, name: str
) -> list[tuple[str, dict[str, Any]]]:
    """(key, payload) per line of the JSON Lines file ``name`` (``fh``: its text);
    :class:`JodlError` naming every bad line's number (blank lines are skipped).
    ``check``: the family's payload model's (a payload it refuses is a bad line). The
    payloads stay objects: the store encodes each once."""
    rows: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    bad: list[str] = []
    for number, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            bad.append(f"line {number}: not JSON ({exc.args[0].split(':')[0]})")
            continue
        if not isinstance(item, dict) or not isinstance(item.get("key"), str) or not item["key"]:
            bad.append(f'line {number}: expected {{"key": "...", "payload": {{...}}}}')
            continue
        body = item.get("payload", {})
        if not isinstance(body, dict):
            bad.append(f"line {number}: payload is not a JSON object")
            continue
        if check is not None:
            try:
                check(body)
            except BadPayload as exc:
                bad.append(f"line {number}: {exc}")
                continue
        key = item["key"]
        if key in seen:
            bad.append(f"line {number}: key {key!r} repeats line {seen[key]}")
            continue
        seen[key] = number
        rows.append((key, body))
    if bad:
        more = f"; and {len(bad) - BAD_LINES_SHOWN} more" if len(bad) > BAD_LINES_SHOWN else ""
        raise JodlError(
            f"{name}: {len(bad)} bad line(s), no job added: "
            + "; ".join(bad[:BAD_LINES_SHOWN])
            + more
        )
    if not rows:
        raise JodlError(f"{name}: no jobs in it")
    return rows


@click.command("results")
@click.argument("family")
@click.option("--run", "number", type=click.IntRange(min=1), default=None, help="Run number.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.pass_context
def results_cmd(ctx: click.Context, family: str, number: int | None, as_json: bool) -> None:
    """Each job's result (or error) in a run of FAMILY (default: its newest run)."""
    found = store_of(ctx).results(family, number)
    if as_json:
        doc = {
            "family": found.family,
            "run": found.run,
            "state": found.state,
            "jobs": [
                {"key": j.key, "state": j.state, "result": j.result, "error": j.error}
                for j in found
            ],
        }
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"run {found.family}#{found.run} ({found.state}): {len(found)} jobs", err=True)
    for j in found:
        text = json.dumps(j.result) if j.ok else (j.error or "")
        click.echo(f"{j.key}\t{j.state}\t{text}")


@jobs.command("delete")
@click.argument("family")
@click.argument("keys", nargs=-1, required=True)
@click.pass_context
def jobs_delete(ctx: click.Context, family: str, keys: tuple[str, ...]) -> None:
    """Delete jobs KEYS of FAMILY: never dispatched again; the running master cancels
    those in flight on their agents (within a second)."""
    store = store_of(ctx)
    deleted = store.delete_jobs(family, list(dict.fromkeys(keys)))
    missing = sorted(set(keys) - set(deleted))
    click.echo(f"{len(deleted)} jobs of {family} deleted")
    if missing:
        raise JodlError(f"no job {', '.join(missing)} in {family} (or already deleted)")


@click.command("run")
@click.argument("words", nargs=-1, required=True, metavar="FAMILY | cancel FAMILY")
@click.option(
    "--takeover",
    is_flag=True,
    help="Take the master lease even from a running master (which then stops).",
)
@click.pass_context
def run_cmd(ctx: click.Context, words: tuple[str, ...], takeover: bool) -> None:
    """Run (or resume) one cycle of FAMILY and print a summary.

    ``jodl run cancel FAMILY`` ends FAMILY's running cycle instead: its unsent jobs
    are not sent, running ones are cancelled on their agents, and the run is
    recorded as cancelled (its unfinished jobs are due in the next run).
    """
    if len(words) == 2 and words[0] == "cancel":
        _cancel_run(ctx, words[1])
        return
    if len(words) != 1:
        raise click.UsageError("give one FAMILY, or `cancel FAMILY`")
    (family,) = words
    from ..master import Master

    settings = settings_of(ctx)
    store = store_of(ctx)
    holder = None if takeover else store.running_master()
    if holder is not None:
        # One master acts per database: the running one runs the cycle, we follow it.
        _run_by(holder, store, family)
        return
    _require_auth(settings)
    if store.family(family) and not settings.register_listen and not store.nodes():
        # Nothing could ever run the jobs: say so instead of waiting forever.
        raise JodlError("no agent nodes registered: add one with `jodl node add HOST:PORT`")
    with progress_reporters(f"run {family}") as (_, progress):
        master = Master(settings, store=store, progress=progress, takeover=takeover)
        from ..ops.server import serve_master

        ops = serve_master(master, taken=logging.INFO)  # health, metrics, profiles (HTTP)
        stop = threading.Event()
        sigterm_sets(stop)  # the step under way ends, then close() commits and releases
        try:
            summary = master.run_cycle(family, stop)
        finally:
            if ops is not None:
                ops.close()
            master.close()
    click.echo(summary.line())
    if summary.dead:
        sys.exit(3)


def _require_auth(settings: Any) -> None:
    """A master calls its agents over the network: without a secret (or TLS) it could
    never connect to one, so it refuses to start (one line) instead of retrying."""
    from ..agent.auth import require_auth

    require_auth(settings, "refusing to start the master")


def _run_by(holder: str, store: Any, family: str) -> None:
    """Ask the running master ``holder`` for a cycle of ``family``; follow it to its end."""
    from ..admin.requests import follow

    request_id = store.request_run(family)
    click.echo(f"a master ({holder}) runs this database: the run is asked of it", err=True)
    with progress_reporters(f"run {family}") as (_, progress):
        # A standby taking over counts as alive: it resumes the run.
        alive = lambda: store.running_master() is not None  # noqa: E731
        row = follow(store, request_id, alive, progress, note=_noter(family))
    if row.error:
        raise JodlError(row.error)
    click.echo(row.summary)
    if row.dead:
        sys.exit(3)


def _noter(family: str) -> Any:
    """Prints why no agent serves the followed run, and when one does again."""

    def note(why: str | None) -> None:
        click.echo(f"run {family}: {why or 'an agent serves it now'}", err=True)

    return note


def _cancel_run(ctx: click.Context, family: str) -> None:
    """Ask the running master to cancel FAMILY's cycle, or cancel it in the log if none runs."""
    from ..log.models import RequestKind

    store = store_of(ctx)
    holder = store.running_master()
    if holder is None:
        run = store.cancel_open_run(family)
        if run is None:
            raise JodlError(f"no running cycle of {family}")
        click.echo(f"run {family}#{run.number} cancelled: {run.jobs_done} done (no master ran it)")
        return
    request_id = store.request_run(family, RequestKind.CANCEL)
    click.echo(f"a master ({holder}) runs this database: the cancel is asked of it", err=True)
    from ..admin.requests import follow  # imports the master: after the request is filed

    row = follow(store, request_id, lambda: store.running_master() is not None)
    if row.error:
        raise JodlError(row.error)
    click.echo(row.summary)


@click.command("master")
@click.option(
    "--takeover",
    is_flag=True,
    help="Take the master lease even from a running master (which then stops).",
)
@click.pass_context
def master_cmd(ctx: click.Context, takeover: bool) -> None:
    """Run the long-lived master (scheduled cycles and on-demand jobs).

    On PostgreSQL a master started beside a running one stands by and takes over
    when that one stops or its lease expires (``JODL_LEASE_TTL``). SIGTERM ends the
    step under way, commits, and hands over at once (a second SIGTERM stops at once).
    """
    from ..master import Master

    _require_auth(settings_of(ctx))
    master = Master(settings_of(ctx), store=store_of(ctx), takeover=takeover)
    stop = threading.Event()
    sigterm_sets(stop)  # the step under way ends, then close() commits and hands over
    stops = []
    from ..ops.server import serve_master

    ops = serve_master(master)  # health, metrics, profiles (HTTP)
    if ops is not None:
        stops.append(ops.close)
    try:
        if master.store.dialect != "sqlite" and master.store.lease_holder() is not None:
            click.echo(f"master {master.name}: standing by", err=True)
        if not master.stand_by(stop):
            return
        master.start()
        from ..admin.requests import RunRequests
        from ..queue import Queue, QueueFeeder

        master.feeders.append(QueueFeeder(Queue(master.store)))  # on-demand jobs
        master.feeders.append(RunRequests(master.store))  # `jodl run` beside this master

        def start_services() -> None:
            # Installed applications' services (e.g. a scheduler) run beside the serve
            # loop; each is a callable start(master, settings) returning its stop
            # function. Started after the first dispatch: a restarted master resumes its
            # runs first (importing the applications takes a good part of a second).
            from ..admin.schedule import start_family_schedules
            from ..settings.plugins import load_group

            for _, start in load_group("jodl.services"):
                stops.append(start(master, master.settings))
            stops.append(start_family_schedules(master))  # families' cron schedules

        master.after_first_dispatch(start_services)
        master.serve(stop)
    except KeyboardInterrupt:
        pass
    finally:
        for stop_service in reversed(stops):
            stop_service()
        master.close()


def register(main: click.Group) -> None:
    """Add ``jobs`` (``add``, ``delete``), ``results``, ``run`` and ``master`` to ``main``."""
    for command in (jobs, results_cmd, run_cmd, master_cmd):
        main.add_command(command)


__all__ = ["BAD_LINES_SHOWN", "register"]
