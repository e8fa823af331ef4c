"""``jodl import FILE --user U`` and ``jodl export --user U --format urlwatch|json``:
a user's trackings from and to urlwatch's ``urls.yaml`` or our JSON format
(:mod:`crawler_app.porting`). An import is all or nothing; its refusal is one line
naming each entry that cannot be mapped by its line."""

from __future__ import annotations

from typing import Any

import click

#: :data:`crawler_app.porting.FORMATS`, named here so `jodl --help` imports no database code.
FORMATS = ("urlwatch", "json")


@click.command("import")
@click.argument("file", type=click.File("rb"))
@click.option("--user", "email", required=True, help="E-mail of the user who will track them.")
@click.option(
    "--format",
    "format_",
    type=click.Choice(FORMATS),
    default=None,
    help="The file's format (default: told from its content; JSON starts with {).",
)
@click.pass_context
def import_(ctx: click.Context, file: Any, email: str, format_: str | None) -> None:
    """USER tracks every page of FILE (a urlwatch urls.yaml, or a jodl export --format
    json; - reads standard input). Nothing is imported if one entry cannot be mapped
    or the user's quota would be exceeded; trackings the user has are updated."""
    from jodl.exceptions import JodlError
    from jodl.queue import Queue

    from . import porting
    from .checking import baselines
    from .commands import _engine, _session

    try:
        text = file.read(porting.MAX_IMPORT_BYTES + 1).decode("utf-8")
    except UnicodeDecodeError:
        raise JodlError(f"{file.name}: not UTF-8 text; nothing imported") from None
    parsed = porting.parse(text, format_)
    with _session(ctx) as s:
        report = porting.import_trackings(s, email, parsed)
    baselines.request(Queue(_engine(ctx)), _engine(ctx), report.baseline_pages)
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"{email}: {report.summary()}")


@click.command("export")
@click.option("--user", "email", required=True, help="E-mail of the user.")
@click.option(
    "--format",
    "format_",
    type=click.Choice(FORMATS),
    default="json",
    show_default=True,
    help="json keeps every field; urlwatch leaves out what it cannot say (and says so "
    "in a comment).",
)
@click.pass_context
def export(ctx: click.Context, email: str, format_: str) -> None:
    """Print USER's trackings as a file jodl import (or urlwatch) reads."""
    from . import porting
    from .commands import _session

    with _session(ctx) as s:
        text = porting.export(s, email, format_)
    click.echo(text, nl=False)


__all__ = ["export", "import_"]
