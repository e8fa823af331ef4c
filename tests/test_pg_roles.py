"""The masters' database role needs no right beyond its tables (docs/security.md): a
takeover ends a stopped leader's write with the role's own right over its own
sessions, never with ``pg_signal_backend``, which would let it end any session on the
server. Run on a throwaway cluster of the test's own, where making roles harms nobody."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from pg_cluster import ThrowawayCluster, cluster_for_tests
from sqlalchemy import create_engine, text

from jodl.log import Store, make_engine
from jodl.log.lease import check_fence
from jodl.log.migrate import upgrade
from jodl.master.leadership import Leadership

#: The masters' role: may log in and owns its database; no other right.
MASTERS = "jodl_masters"
#: Another application's role on the same server.
OTHER = "other_app"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    for made in cluster_for_tests():
        admin = create_engine(made.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for role in (MASTERS, OTHER):
                conn.execute(text(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEROLE"))
            conn.execute(text(f"CREATE DATABASE jodl OWNER {MASTERS}"))
            conn.execute(text(f"CREATE DATABASE other OWNER {OTHER}"))
        admin.dispose()
        yield made


def as_role(cluster: ThrowawayCluster, role: str, database: str) -> str:
    return cluster.url(database).replace("postgres@", f"{role}@")


def test_the_masters_role_holds_no_signal_right(cluster: ThrowawayCluster) -> None:
    engine = make_engine(as_role(cluster, MASTERS, "jodl"))
    try:
        with engine.connect() as conn:
            assert (
                conn.scalar(text("SELECT pg_has_role(current_user, 'pg_signal_backend', 'MEMBER')"))
                is False
            )
            assert (
                conn.scalar(text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))
                is False
            )
    finally:
        engine.dispose()


def test_a_takeover_ends_a_stopped_write_with_the_roles_own_right_and_nothing_else(
    cluster: ThrowawayCluster,
) -> None:
    engine = make_engine(as_role(cluster, MASTERS, "jodl"))
    other = psycopg.connect(
        as_role(cluster, OTHER, "other").replace("postgresql+psycopg", "postgresql"),
        application_name="jodl-epoch:1",  # even a session named like a master's
        autocommit=True,
    )
    try:
        upgrade(engine)
        store = Store(engine)
        leader = Leadership(store, "leader", ttl=1.0)
        standby = Leadership(store, "standby", ttl=5.0)
        assert leader.gain(["f"]) == ["f"]
        conn = engine.connect()
        conn.begin()
        check_fence(conn, leader.epoch)  # the leader's write, named after its epoch
        conn.exec_driver_sql("CREATE TEMP TABLE stuck (x int)")
        copying = conn.connection.driver_connection.cursor().copy("COPY stuck FROM STDIN")
        copy = copying.__enter__()
        copy.write_row((1,))
        try:
            time.sleep(1.0)  # the leader's lease expires while it is stopped mid-COPY
            assert standby.gain(["f"]) == ["f"], "the masters' role ended its own session"
            with pytest.raises(psycopg.OperationalError, match="terminat"):
                copying.__exit__(None, None, None)
        finally:
            conn.invalidate()
            conn.close()
        # Another role's session is out of reach, whatever its name.
        with engine.connect() as check:
            refused = None
            try:
                check.scalar(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE usename = :other"
                    ),
                    {"other": OTHER},
                )
            except Exception as exc:  # noqa: BLE001 - the refusal is what is expected
                refused = exc
        assert refused is not None and "InsufficientPrivilege" in str(refused)
        assert other.execute("SELECT 1").fetchone() == (1,), "the other application's session lives"
    finally:
        other.close()
        engine.dispose()
