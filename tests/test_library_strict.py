"""The Python API as strict as the ``jodl`` command: unknown families, payloads that are
not objects, reads that would create a database, families removed after their jobs,
and ``idempotent`` read from the family class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agents import run_jodl

import jodl
from jodl.exceptions import BadPayload, ConfigError, UnknownFamily
from jodl.log import Store


def test_add_jobs_refuses_a_family_nobody_knows_unless_created(store: Store, db_url: str):
    with pytest.raises(UnknownFamily) as refused:
        jodl.add_jobs("nosuch", {"a": {}}, database_url=db_url)
    message = str(refused.value)
    assert message.startswith("unknown family 'nosuch': no entry point of that name")
    assert "create=True" in message and "\n" not in message
    assert store.family("nosuch") is None, "nothing was created"

    assert jodl.add_jobs("nosuch", {"a": {}}, database_url=db_url, create=True) == 1
    # Known to the database now (its class may live on the agents only).
    assert jodl.add_jobs("nosuch", {"a": {}, "b": {}}, database_url=db_url) == 1
    # Installed here: created as `jodl jobs add` would.
    assert jodl.add_jobs("noop", {"a": {}}, database_url=db_url) == 1
    with pytest.raises(UnknownFamily, match="create=True"):
        store.add_jobs("other", {"a": {}})
    assert store.family("other") is None


@pytest.mark.parametrize(
    "bad",
    [[1, 2], "[1, 2]", 3, None, "not json", '"text"'],
    ids=["list", "list-json", "int", "none", "not-json", "string-json"],
)
def test_a_payload_that_is_not_an_object_is_refused_and_nothing_added(
    store: Store, db_url: str, bad: object
):
    with pytest.raises(BadPayload, match=r"payload of job 'two' ") as refused:
        jodl.add_jobs("noop", {"one": {"ok": 1}, "two": bad}, database_url=db_url)
    assert "\n" not in str(refused.value)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM jodl_job").scalar() == 0
    assert jodl.add_jobs("noop", {"one": '{"ok": 1}'}, database_url=db_url) == 1


def test_a_read_never_creates_a_database(tmp_path: Path):
    nope = tmp_path / "nope.db"
    url = f"sqlite:///{nope}"
    with pytest.raises(ConfigError) as refused:
        jodl.results("noop", database_url=url)
    assert str(refused.value).startswith(f"no database at {nope}: run `jodl db upgrade`")
    assert not nope.exists()
    cli = run_jodl("results", "noop", env={"JODL_DATABASE_URL": url})
    assert cli.returncode == 1
    assert cli.stderr.strip().startswith(f"error: no database at {nope}:")
    assert not nope.exists()
    # A write creates it, as before.
    assert jodl.add_jobs("noop", {"a": {}}, database_url=url) == 1
    assert nope.exists()
    with pytest.raises(jodl.JodlError, match="'noop' has no run"):
        jodl.results("noop", database_url=url)


def families(env: dict[str, str]) -> dict[str, dict]:
    done = run_jodl("family", "list", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {f["name"]: f for f in json.loads(done.stdout)}


def test_a_family_is_removed_once_its_jobs_are_deleted(store: Store, agents, db_url: str):
    env = {"JODL_DATABASE_URL": db_url}
    agents(1, slots=2)
    assert run_jodl("jobs", "add", "noop", "--count", "2", env=env).returncode == 0
    ran = run_jodl("run", "noop", env=env)
    assert ran.returncode == 0, ran.stderr
    assert families(env)["noop"]["jobs"] == 2

    refused = run_jodl("family", "remove", "noop", env=env)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "error: family 'noop' has 2 jobs: delete them first (`jodl jobs delete noop KEY...`)"
    )
    deleted = run_jodl("jobs", "delete", "noop", "job-0", "job-1", env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert families(env)["noop"]["jobs"] == 0, "deleted jobs are not counted"

    removed = run_jodl("family", "remove", "noop", env=env)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.strip() == "family noop removed (2 deleted jobs with it)"
    assert "noop" not in families(env)
    with store.engine.connect() as conn:
        for table in ("jodl_job", "jodl_run", "jodl_execution", "jodl_dispatch"):
            assert conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar() == 0, table
    # The name is free again.
    assert run_jodl("jobs", "add", "noop", "--count", "1", env=env).returncode == 0
    assert families(env)["noop"]["jobs"] == 1


def test_a_family_with_a_running_run_is_not_removed(store: Store, db_url: str):
    fam = store.ensure_family("noop")
    store.add_jobs(fam, {"a": {}})
    store.delete_jobs("noop", ["a"])
    store.open_run(fam, 1)
    refused = run_jodl("family", "remove", "noop", env={"JODL_DATABASE_URL": db_url})
    assert refused.returncode == 1
    assert "run noop#1 is running: cancel it first (`jodl run cancel noop`)" in refused.stderr
    assert store.family("noop") is not None


def test_idempotent_comes_from_the_family_class(store: Store, db_url: str):
    env = {"JODL_DATABASE_URL": db_url}
    assert run_jodl("jobs", "add", "sleep", "--count", "1", env=env).returncode == 0
    assert run_jodl("jobs", "add", "mark", "--count", "1", env=env).returncode == 0
    listed = families(env)
    assert listed["sleep"]["idempotent"] is True, "Sleep.idempotent = True in the class"
    assert listed["mark"]["idempotent"] is False, "Mark declares nothing: not idempotent"
    text = run_jodl("family", "list", env=env).stdout
    assert [line for line in text.splitlines() if line.startswith("sleep ")][0].endswith(
        "idempotent=true"
    )

    # An operator may turn it off, and give the decision back to the class.
    assert run_jodl("family", "set", "sleep", "--idempotent", "false", env=env).returncode == 0
    assert families(env)["sleep"]["idempotent"] is False
    assert run_jodl("family", "set", "sleep", "--idempotent", "none", env=env).returncode == 0
    assert families(env)["sleep"]["idempotent"] is True
    # But never allow what the class forbids.
    refused = run_jodl("family", "set", "mark", "--idempotent", "true", env=env)
    assert refused.returncode == 1
    assert "the class of mark says its jobs must not run twice" in refused.stderr
    assert families(env)["mark"]["idempotent"] is False
