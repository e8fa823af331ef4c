"""Schema migrations (Alembic) of the library and of every installed application.

The library's revisions are the Alembic branch ``jodl``, shipped in the package
(``jodl/log/migrations/versions``). An application keeps its own branch and announces
it in the entry-point group ``jodl.migrations``: the entry point names a package whose
directory holds the application's revisions and whose import registers the
application's models (their tables join :func:`target_metadata`). An application's
first revision depends on the library revision that made the tables it refers to.
``jodl db upgrade`` (:func:`upgrade`) brings every installed branch to its head.

Before the split, one history ``0001`` … ``0010`` held the library's and the
applications' tables. Each revision made from it names, in its ``legacy``
attribute, the old revision it was part of; a database stamped with an old revision
is adopted by :func:`adopt_legacy_stamp` (stamped with the matching revision of
every branch, no table touched) before it is upgraded. See docs/architecture.md#migrations.
"""

from __future__ import annotations

import logging
import os
import re
from importlib import import_module
from types import ModuleType
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, MetaData, column, inspect, table

from ..exceptions import JodlError

log = logging.getLogger("jodl.log.migrate")

#: Entry-point group of the applications' migration packages.
MIGRATIONS_GROUP = "jodl.migrations"
#: The library's Alembic environment (``env.py``) and its own revisions.
LIBRARY_MIGRATIONS = "jodl.log.migrations"
#: A revision id of the single history before the split (four digits).
LEGACY_ID = re.compile(r"\d{4}")


def app_migrations() -> list[ModuleType]:
    """The installed applications' migration packages (entry-point group ``jodl.migrations``)."""
    from ..settings.plugins import load_group

    return [package for _, package in load_group(MIGRATIONS_GROUP)]


def _directory(package: ModuleType) -> str:
    return os.path.dirname(os.path.abspath(str(package.__file__)))


def target_metadata() -> MetaData:
    """The tables the installed branches build: the library's and the applications'."""
    app_migrations()  # importing them registers the applications' models
    from .models import Base

    return Base.metadata


def alembic_config(engine: Engine | None = None) -> Config:
    """The Alembic configuration of the library's branch and every installed application's."""
    library = _directory(import_module(LIBRARY_MIGRATIONS))
    locations = [os.path.join(library, "versions")]
    locations += [_directory(package) for package in app_migrations()]
    cfg = Config()
    cfg.set_main_option("script_location", library)
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_locations", os.pathsep.join(locations))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def run_environment() -> None:
    """The body of an Alembic ``env.py``: the checkout's (``migrations/env.py``, named by
    ``alembic.ini``) and the installed package's (``jodl/log/migrations/env.py``) both
    run this, so ``alembic upgrade heads`` and ``jodl db upgrade`` do the same work.

    The connection is the one :func:`upgrade` passes; without one (the ``alembic``
    command), the database is the one the settings name (``JODL_DATABASE_URL``)."""
    from alembic import context

    if context.is_offline_mode():
        raise JodlError("offline migrations are not supported; run against a database")
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _migrate(context, connection)
        return
    from ..settings.config import Settings
    from .engine import make_engine

    engine = make_engine(Settings.from_env().database_url)
    try:
        with engine.begin() as conn:
            _migrate(context, conn)
    finally:
        engine.dispose()


def _migrate(context: Any, connection: Connection) -> None:
    # A database made by the history before the split is restamped first (no table touched).
    adopt_legacy_stamp(connection, context.script)
    context.configure(
        connection=connection,
        target_metadata=target_metadata(),
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def heads(cfg: Config | None = None) -> tuple[str, ...]:
    """The newest revision of every installed branch, sorted."""
    return tuple(sorted(ScriptDirectory.from_config(cfg or alembic_config()).get_heads()))


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Apply migrations up to ``revision`` (default: every branch's head) on ``engine``."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def current(engine: Engine) -> tuple[str, ...]:
    """The revisions the database is stamped with (one per branch), sorted."""
    with engine.connect() as conn:
        return tuple(sorted(MigrationContext.configure(conn).get_current_heads()))


def adopt_legacy_stamp(connection: Connection, script: ScriptDirectory) -> tuple[str, ...]:
    """Restamp a database made by the single history before the split; returns the new
    stamps (empty: nothing to adopt).

    Old revision ``N`` becomes, in every installed branch, the newest revision whose
    ``legacy`` is at most ``N``: exactly the tables the old history had made by then.
    A database holding tables no installed branch knows (an application's, the
    application not installed) is refused, so that no branch loses its stamp.
    """
    context = MigrationContext.configure(connection)
    stamped = context.get_current_heads()
    old = [rev for rev in stamped if LEGACY_ID.fullmatch(rev)]
    if not old:
        return ()
    number = max(int(rev) for rev in old)
    unknown = sorted(
        set(inspect(connection).get_table_names())
        - set(target_metadata().tables)
        - {"alembic_version"}
    )
    if unknown:
        raise JodlError(
            f"the database (at revision {max(old)} of the history before the split) holds "
            f"tables of applications that are not installed ({', '.join(unknown[:5])}): "
            "install them (pip install 'jodl[apps]') and upgrade again"
        )
    revisions = list(script.walk_revisions())
    done = {rev.revision for rev in revisions if int(_legacy(rev.module) or "10000") <= number}
    # The version table holds no revision another one holds already (through its
    # history or its dependencies): keep only the newest of what was done.
    parents = {
        rev.revision: _tuple(rev.down_revision) + _tuple(rev.dependencies) for rev in revisions
    }
    covered: set[str] = set()
    stack = [parent for rev in done for parent in parents[rev]]
    while stack:
        rev = stack.pop()
        if rev not in covered:
            covered.add(rev)
            stack.extend(parents.get(rev, ()))
    targets = tuple(sorted(done - covered))
    version = table("alembic_version", column("version_num"))
    connection.execute(version.delete().where(version.c.version_num.in_(old)))
    context.stamp(script, targets)  # type: ignore[arg-type]  # a tuple: one per branch
    log.info("adopted a database at revision %s of the old history: %s", max(old), targets)
    return targets


def _tuple(revisions: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if revisions is None:
        return ()
    return (revisions,) if isinstance(revisions, str) else tuple(revisions)


def _legacy(module: Any) -> str | None:
    value = getattr(module, "legacy", None)
    return str(value) if value is not None else None


__all__ = [
    "MIGRATIONS_GROUP",
    "adopt_legacy_stamp",
    "alembic_config",
    "app_migrations",
    "current",
    "heads",
    "run_environment",
    "target_metadata",
    "upgrade",
]
