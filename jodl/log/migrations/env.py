"""Alembic environment of the library's branch and every installed application's
(:mod:`jodl.migrate` gathers them)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from jodl.migrate import adopt_legacy_stamp, target_metadata

config = context.config


def run_migrations(connection: Connection) -> None:
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


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    from jodl.config import Settings
    from jodl.log import make_engine

    engine = make_engine(Settings.from_env().database_url)
    with engine.begin() as conn:
        run_migrations(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")
run_online()
