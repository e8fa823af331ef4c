"""``jodl budget show|set``: families' budgets (:mod:`jodl.admin.budget`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .context import store_of

if TYPE_CHECKING:
    from ..admin.budget import Budgets, Limits

#: The word that puts a budget back to its default (``JODL_FAMILY_*``).
DEFAULT_WORD = "default"


class BudgetValue(click.ParamType):
    """A whole number >= 0 (0: no limit), or ``default``."""

    name = "N|default"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | None:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value  # type: ignore[no-any-return]
        text = str(value).strip().lower()
        if text == DEFAULT_WORD:
            return None
        try:
            number = int(text)
        except ValueError:
            self.fail(f"{value!r} is not a whole number >= 0 nor {DEFAULT_WORD!r}", param, ctx)
        if number < 0:
            self.fail(f"{number} is negative: give a whole number >= 0 (0: no limit)", param, ctx)
        return number


def _line(name: str, limits: Limits) -> str:
    def shown(value: int) -> str:
        return str(value) if value else "no limit"

    return (
        f"{name}: jobs per cycle {shown(limits.jobs_per_cycle)}, on-demand per hour "
        f"{shown(limits.ondemand_per_hour)}, bytes per cycle {shown(limits.bytes_per_cycle)}"
    )


def _budgets(ctx: click.Context) -> Budgets:
    from ..admin.budget import Budgets

    return Budgets(store_of(ctx).engine)


@click.group("budget")
def budget_group() -> None:
    """Families' budgets: jobs per cycle, on-demand jobs per hour, bytes per cycle."""


@budget_group.command("show")
@click.argument("families", nargs=-1)
@click.pass_context
def budget_show(ctx: click.Context, families: tuple[str, ...]) -> None:
    """Show the budgets in effect of FAMILIES (default: all)."""
    for name, limits, _ in _budgets(ctx).show(families or None):
        click.echo(_line(name, limits))


_HELP = "(0: no limit; 'default': the JODL_FAMILY_* setting)"


@budget_group.command("set")
@click.argument("family")
@click.option("--jobs-per-cycle", type=BudgetValue(), help=f"Jobs one cycle runs {_HELP}.")
@click.option(
    "--ondemand-per-hour", type=BudgetValue(), help=f"On-demand jobs claimed per hour {_HELP}."
)
@click.option(
    "--bytes-per-cycle", type=BudgetValue(), help=f"Bytes one cycle's results fetch {_HELP}."
)
@click.pass_context
def budget_set(ctx: click.Context, family: str, **given: Any) -> None:
    """Set some budgets of FAMILY; the others are unchanged."""
    source = ctx.get_parameter_source
    chosen = {k: v for k, v in given.items() if source(k) == click.core.ParameterSource.COMMANDLINE}
    if not chosen:
        raise click.UsageError(
            "give at least one of --jobs-per-cycle, --ondemand-per-hour, --bytes-per-cycle"
        )
    click.echo(_line(family, _budgets(ctx).set(family, **chosen)))


def register(main: click.Group) -> None:
    """Add ``jodl budget`` to the ``jodl`` group."""
    main.add_command(budget_group)


__all__ = ["BudgetValue", "register"]
