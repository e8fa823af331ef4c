"""Alembic environment: the library's and the page checker's tables in one history."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from jodl.migrate import target_metadata

config = context.config


def run_migrations(connection: Connection) -> None:
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
    with engine.connect() as conn:
        run_migrations(conn)
        conn.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")
run_online()
