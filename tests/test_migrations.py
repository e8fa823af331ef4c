"""The Alembic history builds exactly the tables the models declare, on SQLite and PostgreSQL."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from agents import child_env, run_jodl
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from jodl.log import make_engine
from jodl.migrate import alembic_config, current, target_metadata, upgrade


def differences(engine) -> list:  # type: ignore[no-untyped-def]
    """What autogenerate would write in a new migration for this database (empty: nothing)."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(context, target_metadata())


def head() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_autogenerate_finds_no_difference_after_upgrade(db_url):
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        assert current(engine) == head()
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
