"""Shared fixtures: databases (SQLite and real PostgreSQL), the store, settings, real agents.

``db_url`` runs a test once on a fresh SQLite file and once on a fresh PostgreSQL
database created for that test alone (from ``JODL_TEST_DATABASE_URL``, dropped
afterwards), so tests may run in parallel. Without that variable the PostgreSQL
half is skipped with the reason shown; CI always sets it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import TEST_SECRET, AgentProcess, start_agent, start_agents
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from jodl.log import Store, make_engine, normalise_url
from jodl.log.migrate import upgrade
from jodl.settings.config import Settings

# -- databases ------------------------------------------------------------------------------

PG_ENV = "JODL_TEST_DATABASE_URL"
PG_SKIP = f"{PG_ENV} is not set: PostgreSQL tests skipped (CI sets it)"


def pg_server_url() -> str | None:
    """The PostgreSQL server tests may create databases on, or None."""
    url = os.environ.get(PG_ENV, "").strip()
    return normalise_url(url) if url else None


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test alone (dropped afterwards)."""
    server = pg_server_url()
    if server is None:
        pytest.skip(PG_SKIP)
    name = f"jodl_t_{secrets.token_hex(6)}"
    # pool_pre_ping: a test may restart the server (tests/test_pg_restart.py).
    admin = create_engine(server, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def sqlite_database(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jodl.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """An empty database: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_database"))
    return str(request.getfixturevalue("pg_database"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """The reconstruction log on ``db_url``, migrated to the newest revision."""
    engine = make_engine(db_url)
    upgrade(engine)
    yield Store(engine)
    engine.dispose()


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Library settings for ``db_url``, independent of the developer's ``JODL_*`` variables.

    They carry the test session's secret, the one every agent fixture starts with.
    """
    return Settings.from_env(env={}, database_url=db_url, call_timeout=5.0, secret=TEST_SECRET)


@pytest.fixture(autouse=True)
def allowlist_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every user's jobs may use the fetch allowlist in tests (``JODL_FETCH_ALLOW_USERS=*``):
    the tests' sites listen on loopback, which the agents' allowlist admits
    (``tests/app_support.agent_env``). Tests of who may use it set their own value."""
    monkeypatch.setenv("JODL_FETCH_ALLOW_USERS", "*")


# -- agents ---------------------------------------------------------------------------------

AgentFactory = Callable[..., list[AgentProcess]]


@pytest.fixture
def spawn_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """Start one real ``jodl agent`` subprocess: ``spawn_agent(env={...}, args=(...))``.

    ``spawn_agent(count=N, env=...)`` starts N at once and returns a list.

    Every agent started is SIGKILLed at teardown (if still alive).
    """
    started: list[AgentProcess] = []
    log_dir = tmp_path / "agent-logs"
    log_dir.mkdir(exist_ok=True)

    def spawn(env: dict[str, str] | None = None, count: int = 0, **kwargs: Any) -> Any:
        if count:
            many = start_agents(log_dir, count, env=env)
            started.extend(many)
            return many
        agent = start_agent(log_dir, env=env, **kwargs)
        started.append(agent)
        return agent

    yield spawn
    for agent in started:
        agent.kill()


@pytest.fixture
def agents(store: Store, spawn_agent: Callable[..., AgentProcess]) -> AgentFactory:
    """Start N agents and register them as nodes: ``agents(3, slots=4, env={...})``."""

    def start(
        count: int,
        slots: int = 4,
        speed: float | None = None,
        env: dict[str, str] | None = None,
    ) -> list[AgentProcess]:
        extra = dict(env or {})
        extra["JODL_AGENT_SLOTS"] = str(slots)
        # The database too: ``notify`` takes its digests' claims there.
        extra.setdefault("JODL_DATABASE_URL", store.engine.url.render_as_string(False))
        if speed is not None:
            extra["JODL_AGENT_SPEED"] = str(speed)
        out: list[AgentProcess] = spawn_agent(env=extra, count=count)
        for agent in out:
            store.add_node(agent.address, slots=slots)
        return out

    return start
