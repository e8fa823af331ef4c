"""Operators' family commands: ``jodl family list|show|set|allow|deny`` and ``jodl jobs list``.

The logic lives in :mod:`jodl.admin.families`; these commands parse options and print.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ..admin.families import FamilyAdmin, FamilyInfo


class JobStateChoice(click.Choice):  # type: ignore[type-arg]
    """The job states ``jobs list --state`` accepts, read from the models when first
    needed (building the command tree imports no database module)."""

    def __init__(self) -> None:
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:
        from ..admin.families import JOB_STATES

        return tuple(JOB_STATES)

    @choices.setter
    def choices(self, _value: Any) -> None:
        raise AttributeError("the job states are the models' own")


def _show(info: FamilyInfo) -> None:
    click.echo(f"family {info.name}: {info.jobs} jobs")
    for key, value in info.as_dict().items():
        if key in ("name", "jobs", "nodes"):
            continue
        shown = json.dumps(value) if isinstance(value, dict) else value
        click.echo(f"  {key:16s} {'-' if value is None else shown}")
    for rule in info.nodes:
        what = "allowed" if rule.allowed else "denied"
        cap = f" max_slots={rule.max_slots}" if rule.max_slots else ""
        labels = "".join(f" {k}={v}" for k, v in sorted(rule.labels.items()))
        click.echo(f"  node {rule.address:24s} {what}{cap}{labels}")


def register(main: click.Group, store_of: Callable[[click.Context], Any]) -> None:
    """Add ``family`` and ``jobs list`` to the ``jodl`` group (``store_of``: the CLI's store)."""

    def admin(ctx: click.Context) -> FamilyAdmin:
        from ..admin.families import FamilyAdmin

        return FamilyAdmin(store_of(ctx))

    @main.group("family")
    def family() -> None:
        """Families' settings and the nodes that may run them (no code needed)."""

    @family.command("list")
    @click.option("--json", "as_json", is_flag=True, help="One JSON document.")
    @click.pass_context
    def family_list(ctx: click.Context, as_json: bool) -> None:
        """Every family with its strategy, schedule and job count."""
        found = admin(ctx).families()
        if as_json:
            click.echo(json.dumps([f.as_dict() for f in found], indent=2))
            return
        for f in found:
            click.echo(
                f"{f.name:16s} jobs={f.jobs} strategy={f.strategy} "
                f"schedule={f.schedule or '-'} timeout={f.timeout or '-'} "
                f"max_attempts={f.max_attempts or '-'} idempotent={str(f.idempotent).lower()}"
            )

    @family.command("remove")
    @click.argument("name")
    @click.pass_context
    def family_remove(ctx: click.Context, name: str) -> None:
        """Remove NAME once its jobs are deleted (`jodl jobs delete`), with its runs,
        results and node rules."""
        gone = admin(ctx).remove(name)
        click.echo(f"family {name} removed" + (f" ({gone} deleted jobs with it)" if gone else ""))

    @family.command("show")
    @click.argument("name")
    @click.option("--json", "as_json", is_flag=True, help="One JSON document.")
    @click.pass_context
    def family_show(ctx: click.Context, name: str, as_json: bool) -> None:
        """NAME's settings and node rules."""
        info = admin(ctx).family(name)
        if as_json:
            click.echo(json.dumps(info.as_dict(), indent=2))
        else:
            _show(info)

    @family.command("set")
    @click.argument("name")
    @click.option("--timeout", default=None, help="Seconds before a job is taken back ('none').")
    @click.option("--max-attempts", default=None, help="Attempts before a job is dead ('none').")
    @click.option(
        "--idempotent",
        default=None,
        help="true/false: backups of stragglers allowed; none: as the family class says.",
    )
    @click.option("--strategy", default=None, help="Placement strategy (registered name).")
    @click.option("--params", default=None, help="The strategy's parameters, a JSON object.")
    @click.option("--every-n-cycles", default=None, help="Its jobs run every N-th cycle.")
    @click.option("--min-interval", default=None, help="... and at most every S seconds.")
    @click.option(
        "--schedule", default=None, help="Cron line ([SEC] MIN HOUR DAY MONTH WEEKDAY) or 'off'."
    )
    @click.option("--priority", default=None, help="Its jobs' priority (higher first).")
    @click.pass_context
    def family_set(ctx: click.Context, name: str, **options: Any) -> None:
        """Change NAME's settings: all given ones at once, or none if one is bad."""
        changes = {k: v for k, v in options.items() if v is not None}
        if "params" in changes:
            try:
                changes["strategy_params"] = json.loads(changes.pop("params"))
            except ValueError as exc:
                raise click.BadParameter(f"not JSON ({exc})", param_hint="--params") from None
        info = admin(ctx).update(name, changes)
        _show(info)

    def nodes_option(fn: Any) -> Any:
        return click.option(
            "--node",
            "nodes",
            multiple=True,
            required=True,
            help="HOST:PORT of a registered node (repeatable).",
        )(fn)

    @family.command("allow")
    @click.argument("name")
    @nodes_option
    @click.option("--max-slots", type=int, default=None, help="Most jobs of NAME there at once.")
    @click.option("--label", "labels", multiple=True, help="KEY=VALUE the node must carry.")
    @click.pass_context
    def family_allow(
        ctx: click.Context,
        name: str,
        nodes: tuple[str, ...],
        max_slots: int | None,
        labels: tuple[str, ...],
    ) -> None:
        """Let NAME run on the nodes (at most MAX_SLOTS jobs at once on each)."""
        from ..admin.families import check_labels

        info = admin(ctx).set_nodes(name, list(nodes), True, max_slots, check_labels(labels))
        _show(info)

    @family.command("deny")
    @click.argument("name")
    @nodes_option
    @click.pass_context
    def family_deny(ctx: click.Context, name: str, nodes: tuple[str, ...]) -> None:
        """Never place NAME's jobs on the nodes."""
        _show(admin(ctx).set_nodes(name, list(nodes), False))

    jobs = main.commands["jobs"]
    assert isinstance(jobs, click.Group)

    @jobs.command("list")
    @click.argument("family")
    @click.option("--state", type=JobStateChoice(), default=None, help="Only this state.")
    @click.option("--limit", type=click.IntRange(min=1), default=50, help="Most jobs listed.")
    @click.option("--json", "as_json", is_flag=True, help="One JSON document.")
    @click.pass_context
    def jobs_list(
        ctx: click.Context, family: str, state: str | None, limit: int, as_json: bool
    ) -> None:
        """FAMILY's jobs (oldest first), with their state and settings."""
        from ..admin.families import MAX_JOBS_LISTED

        if limit > MAX_JOBS_LISTED:
            raise click.BadParameter(
                f"{limit} is more than the {MAX_JOBS_LISTED} jobs listed at most",
                param_hint="'--limit'",
            )
        rows = admin(ctx).jobs(family, state, limit)
        if as_json:
            click.echo(json.dumps([r.as_dict() for r in rows], indent=2))
            return
        for r in rows:
            err = f"  ({r.last_error})" if r.last_error else ""
            click.echo(
                f"{r.id:6d} {r.key}  {r.state:8s} priority={r.priority} "
                f"every={r.every_n_cycles} attempts={r.attempts}{err}"
            )


__all__ = ["register"]
