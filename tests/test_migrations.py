"""The Alembic branches (library and applications) build exactly the tables the models
declare, on SQLite and PostgreSQL, and adopt databases of the history before the split."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from agents import child_env, run_jodl
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from jodl.exceptions import JodlError
from jodl.log import make_engine
from jodl.log.migrate import alembic_config, current, heads, target_metadata, upgrade


def differences(engine) -> list:  # type: ignore[no-untyped-def]
    """What autogenerate would write in a new migration for this database (empty: nothing)."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(context, target_metadata())


def head() -> str:
    """The revisions a fully upgraded database is at, as ``jodl db upgrade`` prints them."""
    return ", ".join(heads())


def test_autogenerate_finds_no_difference_after_upgrade(db_url):
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        assert current(engine) == heads()
        assert {"jodl_0013", "crawler_0014", "web_0002"} <= set(heads())
        assert differences(engine) == []
    finally:
        engine.dispose()


def test_downgrade_to_base_and_upgrade_again(db_url):
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        cfg = alembic_config(engine)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        leftover = [t for t in inspect(engine).get_table_names() if t != "alembic_version"]
        assert leftover == [], "downgrade to base removes every table"
        upgrade(engine)
        assert differences(engine) == []
    finally:
        engine.dispose()


def test_db_upgrade_runs_from_the_installed_package_anywhere(tmp_path):
    db = tmp_path / "fresh.db"
    env = {"JODL_DATABASE_URL": f"sqlite:///{db}"}
    assert not (tmp_path / "alembic.ini").exists()
    first = run_jodl("db", "upgrade", env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert f"database at revision {head()}" in first.stdout
    again = run_jodl("db", "upgrade", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    engine = make_engine(f"sqlite:///{db}")
    try:
        assert {"jodl_job", "jodl_execution", "jodl_run", "jodl_node"} <= set(
            inspect(engine).get_table_names()
        )
        assert differences(engine) == []
    finally:
        engine.dispose()


def test_alembic_upgrade_heads_works_in_the_checkout(tmp_path):
    """The top-level ``migrations/`` is the environment ``alembic.ini`` names: the
    ``alembic`` command in a checkout builds the same schema as ``jodl db upgrade``."""
    checkout = Path(__file__).resolve().parent.parent
    db = tmp_path / "checkout.db"
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "heads"],
        cwd=checkout,
        env=child_env({"JODL_DATABASE_URL": f"sqlite:///{db}"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    engine = make_engine(f"sqlite:///{db}")
    try:
        assert current(engine) == heads()
        assert differences(engine) == []
    finally:
        engine.dispose()


def test_db_upgrade_from_a_built_wheel(tmp_path):
    """The wheel carries the migrations: upgrade with only the wheel's files importable."""
    checkout = Path(__file__).resolve().parent.parent
    source = tmp_path / "src"
    shutil.copytree(
        checkout,
        source,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "tests", "bench", "build", "dist", "*.egg-info", "__pycache__", "*.db"
        ),
    )
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + [str(source), "-w", str(tmp_path / "wheel")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("jodl-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    db = work / "jodl.db"
    script = (
        "import sys, jodl; from jodl.cli import main; "
        "print('from', jodl.__file__, file=sys.stderr); main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "db", "upgrade"],
        cwd=work,
        env=child_env({"PYTHONPATH": str(site), "JODL_DATABASE_URL": f"sqlite:///{db}"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"from {site}" in result.stderr, "jodl was imported from the wheel"
    assert f"database at revision {head()}" in result.stdout
    engine = make_engine(f"sqlite:///{db}")
    try:
        assert differences(engine) == []
    finally:
        engine.dispose()


# -- the history before the split ---------------------------------------------------------

#: The old single history (0001 ... 0010), kept as test data: databases in the field.
LEGACY = Path(__file__).resolve().parent / "legacy_migrations"


def legacy_upgrade(engine, revision: str) -> None:  # type: ignore[no-untyped-def]
    """Build the database as the old single history did, up to ``revision``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(LEGACY))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def test_the_library_names_no_application() -> None:
    """Layering: the library finds the applications through entry points only."""
    library = Path(__file__).resolve().parent.parent / "jodl"
    named = re.compile(r"crawler_app|\bweb\.|(from|import) web\b")
    for path in library.rglob("*.py"):
        assert not named.search(path.read_text()), path


@pytest.mark.parametrize("old", ["0001", "0003", "0006", "0009"])
def test_a_database_of_the_old_history_is_adopted_at_any_revision(db_url, old):
    engine = make_engine(db_url)
    try:
        legacy_upgrade(engine, old)
        upgrade(engine)
        assert current(engine) == heads()
        assert differences(engine) == []
    finally:
        engine.dispose()


def test_a_database_at_the_old_head_keeps_its_data(db_url):
    engine = make_engine(db_url)
    try:
        legacy_upgrade(engine, "0010")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO jodl_family (id, name, strategy, strategy_params, idempotent, "
                    "settings, created_at) VALUES (7, 'kept', 'earliest_finish', '{}', true, "
                    "'{}', CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO app_user (id, email, created_at, is_admin, email_confirmed, "
                    "session_version) VALUES (3, 'kept@example.org', CURRENT_TIMESTAMP, "
                    "false, true, 0)"
                )
            )
        upgrade(engine)
        assert current(engine) == heads()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name FROM jodl_family")).scalars().all() == ["kept"]
            emails = conn.execute(text("SELECT email FROM app_user")).scalars().all()
            assert emails == ["kept@example.org"]
        assert differences(engine) == []
        upgrade(engine)  # once adopted, an upgrade has nothing left to do
        assert current(engine) == heads()
    finally:
        engine.dispose()


def test_an_old_database_with_tables_no_installed_branch_knows_is_refused(db_url):
    engine = make_engine(db_url)
    try:
        legacy_upgrade(engine, "0010")
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE app_gone (id INTEGER PRIMARY KEY)"))
        with pytest.raises(JodlError, match="app_gone.*install them"):
            upgrade(engine)
        assert current(engine) == ("0010",), "nothing was restamped"
    finally:
        engine.dispose()
