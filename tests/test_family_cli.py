"""``jodl family list|show|set|allow|deny`` and ``jodl jobs list``, good and bad input."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from jodl.cli import main
from jodl.log import Store
from jodl.log.models import FamilyOnNode, FamilyRow, Job


def jodl(store: Store, *args: str) -> Any:
    """Run ``jodl ARGS`` in this process on the store's database (real click group)."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("JODL_")}
    env["JODL_DATABASE_URL"] = store.engine.url.render_as_string(False)
    result = CliRunner().invoke(main, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def snapshot(store: Store) -> Any:
    """Everything the family commands may change."""
    with store.session() as s:
        fams = [
            (
                f.name,
                f.strategy,
                f.strategy_params,
                f.schedule,
                f.timeout,
                f.max_attempts,
                f.idempotent,
            )
            for f in s.scalars(select(FamilyRow).order_by(FamilyRow.id))
        ]
        rules = [
            (r.family_id, r.node_id, r.allowed, r.max_slots, r.conditions)
            for r in s.scalars(select(FamilyOnNode))
        ]
        jobs = [
            (j.key, j.priority, j.every_n_cycles, j.min_interval)
            for j in s.scalars(select(Job).order_by(Job.id))
        ]
    return fams, sorted(rules), jobs


def one_error(result: Any, *needles: str) -> None:
    assert result.exit_code != 0, result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def usage_error(result: Any, needle: str) -> None:
    assert result.exit_code == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert any(needle in line for line in result.stderr.splitlines() if line.startswith("Error"))


@pytest.fixture
def family_db(store: Store) -> Store:
    fam = store.ensure_family("noop")
    store.add_jobs(fam, [(f"k{i}", "{}") for i in range(5)])
    store.ensure_family("sleep")
    store.add_node("127.0.0.1:7001", slots=4)
    store.add_node("127.0.0.1:7002", slots=4)
    return store


def test_list_show_set(family_db: Store) -> None:
    store = family_db
    listed = jodl(store, "family", "list")
    assert listed.exit_code == 0
    assert "noop" in listed.stdout and "jobs=5" in listed.stdout and "sleep" in listed.stdout
    doc = json.loads(jodl(store, "family", "list", "--json").stdout)
    assert [f["name"] for f in doc] == ["noop", "sleep"]

    done = jodl(
        store,
        "family", "set", "noop",
        "--timeout", "2.5", "--max-attempts", "4", "--idempotent", "true",
        "--strategy", "round_robin", "--params", '{"steal": false}',
        "--every-n-cycles", "3", "--min-interval", "60",
        "--schedule", "*/5 * * * *", "--priority", "7",
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    shown = json.loads(jodl(store, "family", "show", "noop", "--json").stdout)
    assert shown["timeout"] == 2.5 and shown["max_attempts"] == 4 and shown["idempotent"]
    assert shown["strategy"] == "round_robin" and shown["strategy_params"] == {"steal": False}
    assert shown["schedule"] == "*/5 * * * *"
    assert (shown["every_n_cycles"], shown["min_interval"], shown["priority"]) == (3, 60.0, 7)
    with store.session() as s:
        assert set(s.scalars(select(Job.every_n_cycles))) == {3}
    # Jobs added later take the family's job settings too.
    assert jodl(store, "jobs", "add", "noop", "--count", "2", "--key-prefix", "new-").exit_code == 0
    later = json.loads(jodl(store, "jobs", "list", "noop", "--json").stdout)[-2:]
    assert [(j["every_n_cycles"], j["min_interval"], j["priority"]) for j in later] == [
        (3, 60.0, 7)
    ] * 2
    assert json.loads(jodl(store, "family", "show", "sleep", "--json").stdout)["priority"] == 0
    # A schedule with seconds (six fields), and one turned off again.
    assert jodl(store, "family", "set", "noop", "--schedule", "*/2 * * * * *").exit_code == 0
    assert store.family("noop").schedule == "*/2 * * * * *"  # type: ignore[union-attr]
    assert jodl(store, "family", "set", "noop", "--schedule", "off").exit_code == 0
    assert store.family("noop").schedule is None  # type: ignore[union-attr]
    assert jodl(store, "family", "set", "noop", "--timeout", "none").exit_code == 0
    assert store.family("noop").timeout is None  # type: ignore[union-attr]
    text = jodl(store, "family", "show", "noop").stdout
    assert "round_robin" in text and "every_n_cycles" in text


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("family", "show", "nope"), ("no family 'nope'", "noop")),
        (("family", "set", "nope", "--timeout", "3"), ("no family 'nope'",)),
        (("family", "set", "noop", "--schedule", "61 * * * *"), ("schedule", "cron")),
        (("family", "set", "noop", "--schedule", "every day"), ("schedule", "cron")),
        (("family", "set", "noop", "--strategy", "fastest"), ("unknown placement strategy",)),
        (("family", "set", "noop", "--params", '{"slow_factor": "x"}'), ("balancing",)),
        (("family", "set", "noop", "--params", '{"explore": -1}'), ("balancing",)),
        (("family", "set", "noop", "--params", "[1]"), ("JSON object",)),
        (("family", "set", "noop", "--timeout", "-1"), ("timeout", "at least")),
        (("family", "set", "noop", "--max-attempts", "0"), ("max_attempts",)),
        (("family", "set", "noop", "--every-n-cycles", "-2"), ("every_n_cycles",)),
        (("family", "set", "noop", "--min-interval", "-5"), ("min_interval",)),
        (("family", "set", "noop", "--idempotent", "maybe"), ("idempotent",)),
        (("family", "set", "noop", "--priority", "high"), ("priority",)),
        (("family", "set", "noop"), ("nothing to set",)),
        # A good value beside a bad one: neither is written.
        (("family", "set", "noop", "--timeout", "9", "--schedule", "bad"), ("schedule",)),
        (("family", "allow", "noop", "--node", "127.0.0.1:9"), ("no node", "jodl node add")),
        (("family", "allow", "nope", "--node", "127.0.0.1:7001"), ("no family",)),
        (
            ("family", "allow", "noop", "--node", "127.0.0.1:7001", "--max-slots", "0"),
            ("max_slots",),
        ),
        (
            ("family", "allow", "noop", "--node", "127.0.0.1:7001", "--label", "novalue"),
            ("KEY=VALUE",),
        ),
        (
            ("family", "allow", "noop", "--node", "127.0.0.1:7001", "--node", "127.0.0.1:9"),
            ("no node",),
        ),
        (("jobs", "list", "nope"), ("no family 'nope'",)),
    ],
)
def test_bad_input_changes_nothing(
    family_db: Store, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    before = snapshot(family_db)
    one_error(jodl(family_db, *args), *needles)
    assert snapshot(family_db) == before


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("jobs", "list", "noop", "--limit", "-1"), "--limit"),
        (("jobs", "list", "noop", "--limit", "0"), "--limit"),
        (("jobs", "list", "noop", "--state", "running"), "--state"),
        (("family", "allow", "noop"), "--node"),
        (("family", "set", "noop", "--params", "{bad"), "--params"),
    ],
)
def test_usage_errors(family_db: Store, args: tuple[str, ...], needle: str) -> None:
    before = snapshot(family_db)
    usage_error(jodl(family_db, *args), needle)
    assert snapshot(family_db) == before


def test_allow_deny(family_db: Store) -> None:
    store = family_db
    done = jodl(
        store, "family", "allow", "noop", "--node", "127.0.0.1:7001", "--node", "127.0.0.1:7002",
        "--max-slots", "1", "--label", "zone=a",
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert "max_slots=1 zone=a" in done.stdout
    assert jodl(store, "family", "deny", "noop", "--node", "127.0.0.1:7002").exit_code == 0
    shown = json.loads(jodl(store, "family", "show", "noop", "--json").stdout)
    assert shown["nodes"] == [
        {"node": "127.0.0.1:7001", "allowed": True, "max_slots": 1, "labels": {"zone": "a"}},
        {"node": "127.0.0.1:7002", "allowed": False, "max_slots": None, "labels": {}},
    ]
    before = snapshot(store)
    usage_error(
        jodl(store, "family", "deny", "noop", "--node", "127.0.0.1:7001", "--max-slots", "2"),
        "--max-slots",
    )
    assert snapshot(store) == before


def test_jobs_list(family_db: Store) -> None:
    store = family_db
    out = jodl(store, "jobs", "list", "noop", "--limit", "2")
    assert out.exit_code == 0
    assert [line.split()[1] for line in out.stdout.splitlines()] == ["k0", "k1"]
    doc = json.loads(jodl(store, "jobs", "list", "noop", "--json", "--state", "idle").stdout)
    assert [j["key"] for j in doc] == [f"k{i}" for i in range(5)]
    assert doc[0]["state"] == "idle" and doc[0]["every_n_cycles"] == 1
    assert json.loads(jodl(store, "jobs", "list", "noop", "--json", "--state", "dead").stdout) == []
    assert jodl(store, "jobs", "list", "sleep").stdout == ""
