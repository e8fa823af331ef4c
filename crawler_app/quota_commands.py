"""``jodl users quota EMAIL``: show or set one user's quotas (:mod:`crawler_app.users.quota`)."""

from __future__ import annotations

from typing import Any

import click

from jodl.cli.budget import BudgetValue

# The same N|default value as family budgets: one parser for both.
QuotaValue = BudgetValue


_HELP = "(0: no limit; 'default': the JODL_USER_* setting)"


@click.command("quota")
@click.argument("email")
@click.option("--trackings", type=QuotaValue(), help=f"Pages the user may track {_HELP}.")
@click.option(
    "--urls-per-day", type=QuotaValue(), help=f"URLs the user may submit in 24 hours {_HELP}."
)
@click.option("--batch", type=QuotaValue(), help=f"URLs the user may submit at once {_HELP}.")
@click.pass_context
def quota(ctx: click.Context, email: str, **given: Any) -> None:
    """Show the quotas of user EMAIL, or set some of them."""
    from .commands import _session
    from .users.pages import get_user
    from .users.quota import Limits, limits_of, set_quota, trackings_count

    source = click.get_current_context().get_parameter_source
    chosen = {k: v for k, v in given.items() if source(k) == click.core.ParameterSource.COMMANDLINE}
    with _session(ctx) as s:
        user = get_user(s, email)
        if chosen:
            set_quota(s, user, **chosen)
        limits = limits_of(s, user.id, Limits.from_env())
        tracked = trackings_count(s, user.id)

    def shown(value: int) -> str:
        return str(value) if value else "no limit"

    verb = "now has" if chosen else "has"
    click.echo(
        f"{user.email} {verb} quotas: trackings {shown(limits.trackings)} ({tracked} used), "
        f"urls per day {shown(limits.urls_per_day)}, batch {shown(limits.batch)}"
    )


__all__ = ["quota"]
