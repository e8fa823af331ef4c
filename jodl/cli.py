"""The ``jodl`` command: a click group over the library (and the applications' commands)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any

import click

from .agent.codec import loads_object
from .config import Settings, markdown_table
from .exceptions import BadPayload, ConfigError, JodlError
from .progress import progress_reporters


def configure_logging(level: str, fmt: str = "text", role: str = "cli") -> None:
    """Log lines at ``level`` on stderr as text or JSON (:mod:`jodl.logs`)."""
    from .logs import configure

    configure(level, fmt, role)


def _settings(ctx: click.Context) -> Settings:
    obj = ctx.ensure_object(dict)
    if "settings" not in obj:
        overrides = {"database_url": obj.get("database_url")}
        obj["settings"] = Settings.from_env(**overrides)
        roles = {"agent": "agent", "master": "master", "run": "master"}
        configure_logging(
            obj["settings"].log_level,
            obj["settings"].log_format,
            roles.get(ctx.info_name or "", "cli"),
        )
    settings: Settings = obj["settings"]
    return settings


def missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite database file that does not exist yet (None: not that case).

    Opening it would create an empty file: a read must not leave one behind.
    """
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - reported when the engine is made
        return None
    path = parsed.database
    if not parsed.drivername.startswith("sqlite") or not path or path == ":memory:":
        return None
    if path.startswith("file:"):
        return None  # a URI filename: its own mode decides
    return None if os.path.exists(path) else path


def _store(ctx: click.Context, create: bool = False) -> Any:
    """The store on the configured database; a missing SQLite file is an error unless
    ``create`` (``jodl db upgrade``): no command creates an empty database by reading."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from .log.engine import make_engine
    from .log.store import Store

    obj = ctx.ensure_object(dict)
    if "store" not in obj:
        url = _settings(ctx).database_url
        missing = None if create else missing_sqlite_file(url)
        if missing is not None:
            raise ConfigError(
                f"no database at {missing}: run `jodl db upgrade` or `jodl up` to create it "
                "(or set JODL_DATABASE_URL)"
            )
        try:
            engine = make_engine(url)
        except (ArgumentError, NoSuchModuleError, ImportError) as exc:
            raise ConfigError(
                f"JODL_DATABASE_URL: not a usable database URL ({_first_line(exc)}); "
                "use sqlite:///FILE or postgresql+psycopg://USER@HOST/DB"
            ) from None
        obj["store"] = Store(engine)
    return obj["store"]


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _database_error(exc: Exception) -> str:
    """One line for a database failure, with the fix when the schema is missing."""
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines()
    first = lines[0] if lines else type(exc).__name__
    if "no such table" in first or ("relation" in first and "does not exist" in first):
        return f"the database has no JODL tables yet ({first}): run `jodl db upgrade`"
    return f"database error: {first}"


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """From now on SIGTERM stops the program as Ctrl-C does (a KeyboardInterrupt)."""
    signal.signal(signal.SIGTERM, _interrupt)


class JodlGroup(click.Group):
    """Turns every expected failure into one clear line and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> Any:
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return super().invoke(ctx)
        except JodlError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except SQLAlchemyError as exc:
            click.echo(f"error: {_database_error(exc)}", err=True)
            sys.exit(1)


@click.group(cls=JodlGroup)
@click.option(
    "--database-url",
    envvar="JODL_DATABASE_URL",
    default=None,
    help="Database of the reconstruction log (overrides JODL_DATABASE_URL).",
)
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """JODL: dispatch job families to agents in cycles, with a crash-proof log."""
    ctx.ensure_object(dict)["database_url"] = database_url


# -- database ---------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.pass_context
def db_upgrade(ctx: click.Context) -> None:
    """Create or migrate the tables to the newest version."""
    from .migrate import current, upgrade

    store = _store(ctx, create=True)
    upgrade(store.engine)
    click.echo(f"database at revision {current(store.engine)}")


@main.command("config")
@click.option("--table", is_flag=True, help="Print the README's table of settings (Markdown).")
def config_table(table: bool) -> None:
    """Show each JODL_* setting's value in effect and where it came from; check them all."""
    from .config import effective

    _load_apps()
    if table:
        click.echo(markdown_table())
        return
    rows = effective()
    width = max(len(row.option.name) for row in rows)
    for row in rows:
        value = row.value if row.value else "(empty)"
        click.echo(f"{row.option.name:{width}s}  {value}  [{row.source}]")


# -- agent ---------------------------------------------------------------------------------


@main.command()
@click.option("--listen", default=None, help="HOST:PORT to listen on (JODL_AGENT_LISTEN).")
@click.option("--slots", type=click.IntRange(min=1), default=None, help="Jobs run at once.")
@click.option(
    "--speed",
    type=click.FloatRange(min=0.001),
    default=None,
    help="Speed factor for the example sleep family (tests, benchmarks).",
)
@click.option("--name", default=None, help="Name reported to the master.")
@click.option(
    "--register",
    "register_url",
    default=None,
    help="Announce this agent once to the master's hello address (HOST:PORT).",
)
@click.option(
    "--advertise",
    default=None,
    help="Address the master should call (default: the listen address).",
)
@click.pass_context
def agent(
    ctx: click.Context,
    listen: str | None,
    slots: int | None,
    speed: float | None,
    name: str | None,
    register_url: str | None,
    advertise: str | None,
) -> None:
    """Serve jobs to the master (rpyc)."""
    from .agent.server import make_server

    settings = _settings(ctx).replace(
        **{k: v for k, v in {"agent_slots": slots, "agent_speed": speed}.items() if v}
    )
    server = make_server(settings, listen=listen, name=name)
    address = listen or settings.agent_listen
    click.echo(f"agent listening on {address} ({settings.agent_slots} slots)", err=True)
    if register_url:
        from .registry import hello

        hello(register_url, advertise or address, settings.agent_slots, settings)
        click.echo(f"registered with {register_url}", err=True)
    signal.signal(signal.SIGTERM, lambda *_: server.close())
    from .ops_server import serve_agent

    ops = serve_agent(server.core, settings)  # health, metrics, profiles (HTTP)
    try:
        server.start()
    except KeyboardInterrupt:
        pass
    finally:
        if ops is not None:
            ops.close()
        server.core.close()


# -- nodes -----------------------------------------------------------------------------------


@main.group()
def node() -> None:
    """Register, list and remove agent nodes."""


@node.command("add")
@click.argument("address")
@click.option("--slots", type=click.IntRange(min=1), default=1)
@click.option("--label", "labels", multiple=True, help="KEY=VALUE, repeatable.")
@click.pass_context
def node_add(ctx: click.Context, address: str, slots: int, labels: tuple[str, ...]) -> None:
    """Add the agent at HOST:PORT (or bring a removed one back)."""
    from .agent.wire import split_address

    try:
        split_address(address)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from None
    pairs = dict(label.split("=", 1) for label in labels if "=" in label)
    n = _store(ctx).add_node(address, slots=slots, labels=pairs)
    click.echo(f"node {n.id} {n.address} active")


@node.command("remove")
@click.argument("address")
@click.pass_context
def node_remove(ctx: click.Context, address: str) -> None:
    """Remove the agent at HOST:PORT: it gets no more jobs."""
    if not _store(ctx).remove_node(address):
        raise JodlError(f"no node {address!r}")
    click.echo(f"node {address} removed")


@node.command("list")
@click.pass_context
def node_list(ctx: click.Context) -> None:
    """List nodes with their state."""
    for n in _store(ctx).nodes(include_removed=True):
        seen = n.last_seen.isoformat(timespec="seconds") if n.last_seen else "never"
        err = f"  ({n.last_error})" if n.last_error else ""
        click.echo(
            f"{n.id:4d} {n.address:24s} {n.state:12s} slots={n.slots} "
            f"speed={n.speed:.2f} seen={seen}{err}"
        )


# -- jobs and cycles ---------------------------------------------------------------------------


@main.group()
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
    type=click.File("r", encoding="utf-8"),
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
    from . import family as families

    families.load(family)  # refuse an unknown family before writing anything
    if from_file is not None:
        if count is not None or payload is not None:
            raise click.BadParameter("give --from, or --count/--payload", param_hint="--from")
        rows = _read_jobs(from_file)
    else:
        payload = payload or "{}"
        try:
            loads_object(payload)
        except BadPayload as exc:
            raise click.BadParameter(str(exc), param_hint="--payload") from None
        rows = [(f"{key_prefix}{i}", payload) for i in range(count or 1)]
    store = _store(ctx)
    fields: dict[str, Any] = {}
    if strategy:
        from .placement import strategy as make_strategy

        try:
            make_strategy(strategy)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--strategy") from None
        fields["strategy"] = strategy
    if max_attempts:
        fields["max_attempts"] = max_attempts
    fam = store.ensure_family(family, **fields)
    added = store.add_jobs(fam, rows)
    kept = len(rows) - added
    click.echo(f"{added} jobs added to {family}" + (f" ({kept} keys existed)" if kept else ""))


#: Bad lines of a jobs file named in the error at most.
BAD_LINES_SHOWN = 5


def _read_jobs(fh: Any) -> list[tuple[str, str]]:
    """(key, payload JSON) per line of a JSON Lines file; :class:`JodlError` naming every
    bad line's number (blank lines are skipped)."""
    rows: list[tuple[str, str]] = []
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
        key = item["key"]
        if key in seen:
            bad.append(f"line {number}: key {key!r} repeats line {seen[key]}")
            continue
        seen[key] = number
        rows.append((key, json.dumps(body)))
    name = getattr(fh, "name", "the file")
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


@main.command("results")
@click.argument("family")
@click.option("--run", "number", type=click.IntRange(min=1), default=None, help="Run number.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.pass_context
def results_cmd(ctx: click.Context, family: str, number: int | None, as_json: bool) -> None:
    """Each job's result (or error) in a run of FAMILY (default: its newest run)."""
    found = _store(ctx).results(family, number)
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


@main.command("run")
@click.argument("family")
@click.option(
    "--takeover",
    is_flag=True,
    help="Take the master lease even from a running master (which then stops).",
)
@click.pass_context
def run_cmd(ctx: click.Context, family: str, takeover: bool) -> None:
    """Run (or resume) one cycle of FAMILY and print a summary."""
    from .master import Master

    settings = _settings(ctx)
    store = _store(ctx)
    holder = None if takeover else store.lease_holder()
    if holder is not None:
        # One master acts per database: the running one runs the cycle, we follow it.
        _run_by(holder, store, family)
        return
    if store.family(family) and not settings.register_listen and not store.nodes():
        # Nothing could ever run the jobs: say so instead of waiting forever.
        raise JodlError("no agent nodes registered: add one with `jodl node add HOST:PORT`")
    with progress_reporters(f"run {family}") as (_, progress):
        master = Master(settings, store=store, progress=progress, takeover=takeover)
        from .ops_server import serve_master

        ops = serve_master(master, taken=logging.INFO)  # health, metrics, profiles (HTTP)
        try:
            summary = master.run_cycle(family)
        finally:
            if ops is not None:
                ops.close()
            master.close()
    click.echo(summary.line())
    if summary.dead:
        sys.exit(3)


def _run_by(holder: str, store: Any, family: str) -> None:
    """Ask the running master ``holder`` for a cycle of ``family``; follow it to its end."""
    from .run_requests import follow

    request_id = store.request_run(family)
    click.echo(f"a master ({holder}) runs this database: the run is asked of it", err=True)
    with progress_reporters(f"run {family}") as (_, progress):
        row = follow(store, request_id, lambda: store.lease_holder() is not None, progress)
    if row.error:
        raise JodlError(row.error)
    click.echo(row.summary)
    if row.dead:
        sys.exit(3)


@main.command("master")
@click.option(
    "--takeover",
    is_flag=True,
    help="Take the master lease even from a running master (which then stops).",
)
@click.pass_context
def master_cmd(ctx: click.Context, takeover: bool) -> None:
    """Run the long-lived master (scheduled cycles and on-demand jobs)."""
    from .master import Master

    master = Master(_settings(ctx), store=_store(ctx), takeover=takeover)
    sigterm_as_interrupt()
    stops = []
    from .ops_server import serve_master

    ops = serve_master(master)  # health, metrics, profiles (HTTP)
    if ops is not None:
        stops.append(ops.close)
    try:
        master.start()
        # Installed applications' services (e.g. a scheduler) run beside the serve loop;
        # each is a callable start(master, settings) returning its stop function.
        from importlib.metadata import entry_points

        for ep in entry_points(group="jodl.services"):
            stops.append(ep.load()(master, master.settings))
        from .queue import Queue, QueueFeeder
        from .run_requests import RunRequests

        master.feeders.append(QueueFeeder(Queue(master.store)))  # on-demand jobs
        master.feeders.append(RunRequests(master.store))  # `jodl run` beside this master
        from .family_schedule import start_family_schedules

        stops.append(start_family_schedules(master))  # families' cron schedules
        master.serve()
    except KeyboardInterrupt:
        pass
    finally:
        for stop in reversed(stops):
            stop()
        master.close()


@main.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Live view, refreshed every second (Ctrl-C stops).")
@click.pass_context
def status(ctx: click.Context, as_json: bool, watch: bool) -> None:
    """Runs, nodes and job counts."""
    from .status import collect

    if watch:
        from .cli_ops import watch_status

        watch_status(_store(ctx), _settings(ctx))
        return

    data = collect(_store(ctx))
    if as_json:
        click.echo(json.dumps(data, default=str, indent=2))
        return
    click.echo("nodes:")
    for n in data["nodes"]:
        click.echo(
            f"  {n['address']:24s} {n['state']:12s} slots={n['slots']} speed={n['speed']:.2f}"
        )
    click.echo("families:")
    for f in data["families"]:
        counts = " ".join(f"{k}={v}" for k, v in sorted(f["jobs"].items()))
        click.echo(f"  {f['name']:16s} {counts}")
    click.echo("queue:")
    for name, c in sorted(data.get("queue", {}).items()):
        click.echo(
            f"  {name:16s} queued={c['queued']} running={c['running']} "
            f"overdue={c['overdue']} dead={c['dead']} done={c['done']}"
        )
    click.echo("runs:")
    for r in data["runs"]:
        ratio = (
            f" makespan={r['makespan']:.2f}s LB={r['lower_bound']:.2f}s ratio={r['ratio']:.2f}"
            if r["ratio"]
            else ""
        )
        click.echo(
            f"  {r['family']}#{r['number']:<5d} {r['state']:9s} "
            f"done={r['jobs_done']}/{r['jobs_total']} failed={r['jobs_failed']} "
            f"dead={r['jobs_dead']}{ratio}"
        )


# -- on-demand queue ---------------------------------------------------------------------------


def _queue(ctx: click.Context) -> Any:
    from .queue import Queue

    return Queue(_store(ctx))


@main.group("queue")
def queue_group() -> None:
    """The on-demand queue: add, list, count, delete and re-queue jobs."""


@queue_group.command("add")
@click.argument("family")
@click.argument("key")
@click.option("--payload", default="{}", help="JSON object given to the job.")
@click.option("--delay", type=click.FloatRange(min=0), default=0.0, help="Due in this many s.")
@click.option("--priority", type=int, default=0, help="Higher runs first among due jobs.")
@click.pass_context
def queue_add(
    ctx: click.Context, family: str, key: str, payload: str, delay: float, priority: int
) -> None:
    """Queue job KEY of FAMILY (an existing KEY moves to the new due time)."""
    from . import family as families

    families.load(family)  # refuse an unknown family before writing anything
    try:
        loads_object(payload)
    except BadPayload as exc:
        raise click.BadParameter(str(exc), param_hint="--payload") from None
    job_id = _queue(ctx).enqueue(family, key, payload, delay=delay, priority=priority)
    click.echo(f"job {job_id} {family}/{key} queued, due in {delay:g}s")


@queue_group.command("list")
@click.argument("family", required=False)
@click.option(
    "--state",
    type=click.Choice(["queued", "claimed", "done", "dead"]),
    default=None,
    help="Only jobs in this state.",
)
@click.option("--limit", type=click.IntRange(min=1), default=50)
@click.pass_context
def queue_list(ctx: click.Context, family: str | None, state: str | None, limit: int) -> None:
    """List jobs of the queue, most urgent first."""
    for j in _queue(ctx).jobs(family, state=state, limit=limit):
        due = j.due_at.isoformat(timespec="seconds") + "Z" if j.due_at else "-"
        err = f"  ({j.last_error})" if j.last_error and j.state != "done" else ""
        click.echo(
            f"{j.id:6d} {j.family}/{j.key}  {j.state:8s} due={due} priority={j.priority} "
            f"attempts={j.attempts} failures={j.failures}{err}"
        )


@queue_group.command("counts")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def queue_counts(ctx: click.Context, as_json: bool) -> None:
    """Queued, running, overdue, dead and done jobs per family."""
    counts = _queue(ctx).counts()
    if as_json:
        click.echo(json.dumps(counts, indent=2, sort_keys=True))
        return
    for name, c in sorted(counts.items()):
        click.echo(
            f"{name:16s} queued={c['queued']} running={c['running']} "
            f"overdue={c['overdue']} dead={c['dead']} done={c['done']}"
        )


@queue_group.command("requeue-dead")
@click.argument("family")
@click.argument("keys", nargs=-1)
@click.pass_context
def queue_requeue_dead(ctx: click.Context, family: str, keys: tuple[str, ...]) -> None:
    """Queue the dead jobs of FAMILY again (all, or only KEYS), due now."""
    count = _queue(ctx).requeue_dead(family, list(keys) or None)
    click.echo(f"{count} dead jobs of {family} queued again")


@queue_group.command("delete")
@click.argument("family")
@click.argument("key")
@click.pass_context
def queue_delete(ctx: click.Context, family: str, key: str) -> None:
    """Delete job KEY of FAMILY: never dispatched again, cancelled if running."""
    if not _queue(ctx).delete(family, key):
        raise JodlError(f"no job {family}/{key} to delete")
    click.echo(f"job {family}/{key} deleted")


def _load_apps() -> None:
    """Let installed applications add their commands and settings."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="jodl.commands"):
        ep.load()(main)


from .cli_budget import register as _register_budget  # noqa: E402 - budget
from .cli_family import register as _register_family  # noqa: E402 - family, jobs list
from .cli_ops import register as _register_ops  # noqa: E402 - profile

_register_ops(main)
_register_budget(main)
_register_family(main, _store)
_load_apps()
