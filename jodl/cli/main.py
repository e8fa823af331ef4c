"""The ``jodl`` command: a click group over the library (and the applications' commands).

Building the command tree imports no database, network or application module: each
command imports what it needs when it runs, so ``jodl --help`` answers at once.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

import click

from ..exceptions import JodlError
from .budget import register as register_budget
from .context import database_error, missing_sqlite_file, settings_of, store_of
from .family import register as register_family
from .jobs import register as register_jobs
from .ops import register as register_ops
from .queue import register as register_queue


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
            click.echo(f"error: {database_error(exc)}", err=True)
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
    from ..log.migrate import current, upgrade

    store = store_of(ctx, create=True)
    upgrade(store.engine)
    click.echo(f"database at revision {', '.join(current(store.engine))}")


@main.command("config")
@click.option("--table", is_flag=True, help="Print the README's table of settings (Markdown).")
def config_table(table: bool) -> None:
    """Show each JODL_* setting's value in effect and where it came from; check them all."""
    from ..settings.config import effective, markdown_table

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
    "register_urls",
    multiple=True,
    help="A master's hello address HOST:PORT (repeatable, or a comma list): the agent says "
    "hello at start and again whenever it is detached.",
)
@click.option(
    "--advertise",
    default=None,
    help="Address the master should call (default: the listen address).",
)
@click.option("--label", "labels", multiple=True, help="KEY=VALUE sent in the hello, repeatable.")
@click.option(
    "--key-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="File holding this node's key (what `jodl node key ADDRESS` prints; JODL_NODE_KEY).",
)
@click.pass_context
def agent(
    ctx: click.Context,
    listen: str | None,
    slots: int | None,
    speed: float | None,
    name: str | None,
    register_urls: tuple[str, ...],
    advertise: str | None,
    labels: tuple[str, ...],
    key_file: str | None,
) -> None:
    """Serve jobs to the master (rpyc). SIGTERM drains: the agent exits once its results
    are acknowledged (a second SIGTERM exits at once). SIGHUP reloads the installed
    families (a package installed since is served; held results are kept)."""
    from ..agent.server import make_server

    settings = settings_of(ctx).replace(
        **{k: v for k, v in {"agent_slots": slots, "agent_speed": speed}.items() if v}
    )
    if key_file:
        settings = settings.replace(node_key=_read_key_file(key_file))
    masters = _master_addresses(register_urls)
    server = make_server(settings, listen=listen, name=name)
    address = listen or settings.agent_listen
    click.echo(f"agent listening on {address} ({settings.agent_slots} slots)", err=True)
    greeter = None
    if masters:
        from ..agent.registry import Greeter

        pairs = dict(label.split("=", 1) for label in labels if "=" in label)
        greeter = Greeter(
            server.core,
            masters,
            advertise or address,
            settings,
            pairs,
            lambda: server.drain.requested,
        )
        greeter.start()
        click.echo(f"saying hello to {', '.join(masters)}", err=True)

    def terminate(*_: object) -> None:
        if server.drain.requested:
            server.close()  # a second SIGTERM: stop at once
            return
        server.drain.start("SIGTERM")

    def reload_families(*_: object) -> None:
        # Off the signal handler: importing packages there could deadlock the import lock.
        threading.Thread(target=server.core.reload, args=("SIGHUP",), daemon=True).start()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, reload_families)
    server.drain.exit_when_drained(server.close)  # asked by SIGTERM or by the master
    from ..ops.server import serve_agent

    ops = serve_agent(server.core, settings)  # health, metrics, profiles (HTTP)
    try:
        server.start()
    except KeyboardInterrupt:
        pass
    finally:
        if greeter is not None:
            greeter.close()
        server.drain.close()
        if ops is not None:
            ops.close()
        server.core.close()


def _read_key_file(path: str) -> str:
    from ..exceptions import ConfigError
    from ..settings.config import check_node_key

    try:
        with open(path, encoding="ascii") as fh:
            key = fh.read().strip()
        check_node_key(key)
    except (OSError, UnicodeError) as exc:
        raise JodlError(f"--key-file {path}: cannot read it ({exc})") from None
    except ConfigError as exc:
        raise JodlError(f"--key-file {path}: {exc}") from None
    return key


def _master_addresses(values: tuple[str, ...]) -> list[str]:
    from ..agent.registry import master_addresses

    try:
        return master_addresses(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--register") from None


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
    from ..agent.wire import split_address

    try:
        split_address(address)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from None
    pairs = dict(label.split("=", 1) for label in labels if "=" in label)
    n = store_of(ctx).add_node(address, slots=slots, labels=pairs)
    click.echo(f"node {n.id} {n.address} active")


@node.command("key")
@click.argument("address")
@click.pass_context
def node_key_cmd(ctx: click.Context, address: str) -> None:
    """Print the key of the agent masters call at HOST:PORT (run where JODL_SECRET is set).

    Give it to that agent alone (JODL_NODE_KEY, or a file for --key-file): it proves
    itself to the masters and says hello with it, and cannot command any other agent.
    """
    secret = _master_secret(address, ctx, "jodl node key")
    if missing_sqlite_file(settings_of(ctx).database_url):
        accepted = (0, 0)  # no log yet: no node was rekeyed
    else:
        accepted = store_of(ctx).node_key_range(address)
    click.echo(_current_node_key(secret, address, accepted))


@node.command("rekey")
@click.argument("address")
@click.option(
    "--keep-old",
    is_flag=True,
    help="Keep accepting the node's older keys until --drop-old (a rollover: the agent "
    "serves on while its new key is put in place). Without it, they are refused at once.",
)
@click.option(
    "--drop-old",
    is_flag=True,
    help="Draw no new key: refuse every key of the node but its newest (ends a rollover).",
)
@click.pass_context
def node_rekey_cmd(ctx: click.Context, address: str, keep_old: bool, drop_old: bool) -> None:
    """Replace the key of the node at HOST:PORT alone, the cluster running; print the new
    key (run where JODL_SECRET is set).

    Its older keys are refused at once (a host taken over): each master closes its
    connection to the node and opens a new one, which the agent must prove under the
    new key. Give the agent the printed key (JODL_NODE_KEY or --key-file) and restart it.
    """
    if keep_old and drop_old:
        raise click.UsageError("--keep-old and --drop-old exclude each other")
    secret = _master_secret(address, ctx, "jodl node rekey")
    store = store_of(ctx)
    if drop_old:
        accepted = store.drop_old_node_keys(address)
    else:
        accepted = store.rekey_node(address, keep_old=keep_old)
    if accepted is None:
        raise JodlError(f"no node {address} in the log (jodl node list)")
    click.echo(_current_node_key(secret, address, accepted))
    oldest, newest = accepted
    older = (
        f"generations {oldest}-{newest - 1} still accepted"
        if oldest < newest
        else "no older key accepted"
    )
    click.echo(f"node {address}: key generation {newest}, {older}", err=True)


def _master_secret(address: str, ctx: click.Context, command: str) -> str:
    """JODL_SECRET, for a command that derives the key of the node at ``address``."""
    from ..agent.wire import split_address

    try:
        split_address(address)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from None
    secret = settings_of(ctx).secret
    if not secret:
        raise JodlError(f"{command} derives the key from JODL_SECRET: set it (on a master host)")
    return secret


def _current_node_key(secret: str, address: str, accepted: tuple[int, int]) -> str:
    from ..agent.keys import node_key

    return node_key(secret, address, accepted[1])


@node.command("remove")
@click.argument("address")
@click.pass_context
def node_remove(ctx: click.Context, address: str) -> None:
    """Remove the agent at HOST:PORT: it gets no more jobs."""
    if not store_of(ctx).remove_node(address):
        raise JodlError(f"no node {address!r}")
    click.echo(f"node {address} removed")


@node.command("drain")
@click.argument("address")
@click.pass_context
def node_drain(ctx: click.Context, address: str) -> None:
    """Drain the agent at HOST:PORT: nothing new goes there, what it runs finishes and is
    collected, then the agent exits and the node is removed."""
    if not store_of(ctx).drain_node(address):
        raise JodlError(f"no node {address!r} (or it is removed)")
    click.echo(f"node {address} draining")


#: Seconds ``jodl node reload`` waits for the running master to relay the reload.
RELOAD_WAIT = 15.0


@node.command("reload")
@click.argument("address", required=False)
@click.pass_context
def node_reload(ctx: click.Context, address: str | None) -> None:
    """Make the agent at HOST:PORT (default: every live node's) read its installed
    families again, e.g. after installing a package with a family. The running master
    relays it; queued, running and held jobs are kept."""
    store = store_of(ctx)
    asked = store.ask_reload(address)
    if not asked:
        raise JodlError(f"no live node {address!r}" if address else "no live nodes: add one first")
    if store.running_master() is None:
        click.echo(
            f"reload asked of {len(asked)} node(s): no master runs now; "
            "the next one relays it when it starts"
        )
        return
    deadline = time.monotonic() + RELOAD_WAIT
    waiting = {n.id for n in store.nodes() if n.address in asked}
    while waiting and time.monotonic() < deadline:
        time.sleep(0.2)
        waiting &= set(store.reloads_asked())
    for n in store.nodes():
        if n.address in asked and n.id not in waiting:
            names = ", ".join(f"{k} {v.get('version', '?')}" for k, v in sorted(n.families.items()))
            click.echo(f"node {n.address} reloaded: {names or 'no families'}")
    if waiting:
        late = sorted(n.address for n in store.nodes() if n.id in waiting)
        raise JodlError(
            f"not reloaded within {RELOAD_WAIT:.0f} s: {', '.join(late)} (not reachable, "
            "or no master relays it); it is relayed when the node answers"
        )


@node.command("list")
@click.pass_context
def node_list(ctx: click.Context) -> None:
    """List nodes with their state, when a master last heard from each, and where its
    agent serves health and /metrics."""
    from ..log.nodes import OPS_LABEL

    for n in store_of(ctx).nodes(include_removed=True):
        seen = n.last_seen.isoformat(timespec="seconds") if n.last_seen else "never"
        err = f"  ({n.last_error})" if n.last_error else ""
        ops = (n.labels or {}).get(OPS_LABEL)
        where = f" ops={ops}" if ops else ""
        click.echo(
            f"{n.id:4d} {n.address:24s} {n.state:12s} slots={n.slots} "
            f"speed={n.speed:.2f} seen={seen}{where}{err}"
        )


@main.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Live view, refreshed every second (Ctrl-C stops).")
@click.pass_context
def status(ctx: click.Context, as_json: bool, watch: bool) -> None:
    """Runs, nodes and job counts."""
    from ..ops.status import collect

    if watch:
        from .ops import watch_status

        watch_status(store_of(ctx), settings_of(ctx))
        return

    data = collect(store_of(ctx))
    if as_json:
        click.echo(json.dumps(data, default=str, indent=2))
        return
    click.echo("masters:")
    for m in data["masters"]:
        led = ", ".join("every family" if f == "*" else f for f in m["families"])
        epoch = f" (epoch {m['epoch']})" if m["epoch"] is not None else ""
        click.echo(f"  {m['name']:24s} {m['role']:8s} {led}{epoch}")
    click.echo("nodes:")
    for n in data["nodes"]:
        families = ",".join(n["families"]) or "-"
        click.echo(
            f"  {n['address']:24s} {n['state']:12s} slots={n['slots']} speed={n['speed']:.2f} "
            f"families={families}"
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
        if r.get("unserved") and r["state"] == "running":
            click.echo(f"      {r['unserved']}")
        for job in r.get("progress", ()):
            click.echo(f"      {job['key']}: {progress_text(job)}")


def progress_text(job: dict[str, Any]) -> str:
    """A running job's report (``jodl.progress``) as ``40/100 (40%) resizing``."""
    done, total = job["done"], job["total"]
    text = f"{done:g}/{total:g} ({100 * done / total:.0f}%)" if total else f"{done:g}"
    return f"{text} {job['note']}".rstrip()


def load_apps(group: click.Group) -> None:
    """Let installed applications add their commands (entry-point group ``jodl.commands``)."""
    from ..settings.plugins import load_group

    for _, register in load_group("jodl.commands"):
        register(group)


register_jobs(main)  # jobs, results, run, master
register_queue(main)  # queue
register_ops(main)  # profile
register_budget(main)  # budget
register_family(main, store_of)  # family, jobs list
load_apps(main)
