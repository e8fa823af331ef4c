"""What every ``jodl`` command (the library's and the applications') takes from the click
context: the settings, the store on the configured database, logging and signals.

These are the public helpers an application's commands use (entry-point group
``jodl.commands``); importing this module is cheap, the database modules load on use.
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

import click

from ..exceptions import ConfigError
from ..obs import tracing
from ..settings.config import Settings

if TYPE_CHECKING:
    from ..log.store import Store

#: The role a command's log lines carry, by command name (others: "cli").
ROLES = {"agent": "agent", "master": "master", "run": "master"}


def configure_logging(level: str, fmt: str = "text", role: str = "cli") -> None:
    """Log lines at ``level`` on stderr as text or JSON (:mod:`jodl.obs.logs`)."""
    from ..obs.logs import configure

    configure(level, fmt, role)


def settings_of(ctx: click.Context) -> Settings:
    """The command's settings (``JODL_*``, ``--database-url``), read once per command;
    the first read also sets up logging."""
    obj = ctx.ensure_object(dict)
    if "settings" not in obj:
        overrides = {"database_url": obj.get("database_url")}
        obj["settings"] = Settings.from_env(**overrides)
        tracing.configure(obj["settings"].traces)
        configure_logging(
            obj["settings"].log_level,
            obj["settings"].log_format,
            ROLES.get(ctx.info_name or "", "cli"),
        )
    settings: Settings = obj["settings"]
    return settings


def missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite database file that does not exist yet (None: not that case);
    see :func:`jodl.log.engine.missing_sqlite_file`."""
    from ..log.engine import missing_sqlite_file as missing

    return missing(url)


def store_of(ctx: click.Context, create: bool = False) -> Store:
    """The store on the configured database, made once per command; a missing SQLite file
    is an error unless ``create`` (``jodl db upgrade``): no command creates an empty
    database by reading."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from ..log.engine import make_engine
    from ..log.store import Store

    obj = ctx.ensure_object(dict)
    if "store" not in obj:
        url = settings_of(ctx).database_url
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
                f"JODL_DATABASE_URL: not a usable database URL ({first_line(exc)}); "
                "use sqlite:///FILE or postgresql+psycopg://USER@HOST/DB"
            ) from None
        obj["store"] = Store(engine)
    store: Store = obj["store"]
    return store


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def database_error(exc: Exception) -> str:
    """One line for a database failure, with the fix when the schema is missing."""
    orig = getattr(exc, "orig", None)
    first = first_line(orig if orig is not None else exc)
    if "no such table" in first or ("relation" in first and "does not exist" in first):
        return f"the database has no JODL tables yet ({first}): run `jodl db upgrade`"
    return f"database error: {first}"


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """From now on SIGTERM stops the program as Ctrl-C does (a KeyboardInterrupt)."""
    signal.signal(signal.SIGTERM, _interrupt)


def sigterm_sets(stop: threading.Event) -> None:
    """From now on the first SIGTERM sets ``stop`` (a loop ends between two steps);
    a second one stops the program at once, as Ctrl-C does."""

    def _first(_signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, _interrupt)
        stop.set()

    signal.signal(signal.SIGTERM, _first)


__all__ = [
    "configure_logging",
    "database_error",
    "missing_sqlite_file",
    "settings_of",
    "sigterm_as_interrupt",
    "sigterm_sets",
    "store_of",
]
