"""Schema migrations (Alembic), runnable from an installed package: ``jodl db upgrade``."""

from __future__ import annotations

import importlib
import os
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, MetaData

from .log.models import Base

#: Modules whose models join the library's metadata when they are installed.
APP_MODELS = ("crawler_app.models", "web.models")


def target_metadata() -> MetaData:
    """The library's metadata plus the installed applications' tables."""
    for name in APP_MODELS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name.split(".")[0] and exc.name != name:
                raise
    return Base.metadata


def alembic_config(engine: Engine | None = None) -> Config:
    import migrations

    cfg = Config()
    cfg.set_main_option("script_location", os.path.dirname(migrations.__file__))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` on ``engine``'s database."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def current(engine: Engine) -> Any:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
