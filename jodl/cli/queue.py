"""``jodl queue``: the on-demand queue (add, list, count, delete and re-queue jobs)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..exceptions import BadPayload, JodlError
from .context import store_of


def _queue(ctx: click.Context) -> Any:
    from ..queue import Queue

    return Queue(store_of(ctx))


@click.group("queue")
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
    from .. import family as families

    families.load(family)  # refuse an unknown family before writing anything
    from ..agent.codec import loads_object

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


def register(main: click.Group) -> None:
    """Add ``queue`` to ``main``."""
    main.add_command(queue_group)


__all__ = ["register"]
