"""What operators tripped on: a master without a secret, settings ``jodl config`` let
pass, files ``jodl up`` leaves in the checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from agents import run_jodl

from jodl.log import Store

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [("master",), ("run", "noop")])
def test_a_master_without_a_secret_refuses_to_start(store: Store, db_url: str, command):
    store.add_node("127.0.0.1:9", slots=1)
    store.add_jobs(store.ensure_family("noop"), {"a": {}})
    done = run_jodl(*command, env={"JODL_DATABASE_URL": db_url, "JODL_SECRET": None}, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "error: refusing to start the master without authentication: set JODL_SECRET"
    )
    assert store.running_master() is None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"JODL_FETCH_ALLOW": "10.0.0.0/33"}, "JODL_FETCH_ALLOW"),
        ({"JODL_SMTP_USER": "mailer", "JODL_SMTP_STARTTLS": "false"}, "JODL_SMTP"),
    ],
)
def test_jodl_config_exits_non_zero_for_an_invalid_value(env, named):
    done = run_jodl("config", env=env)
    assert done.returncode == 1, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], done.stderr


def test_jodl_config_passes_good_values():
    done = run_jodl("config", env={"JODL_FETCH_ALLOW": "10.1.0.0/16,127.0.0.0/8"})
    assert done.returncode == 0, done.stderr
    assert "10.1.0.0/16,127.0.0.0/8" in done.stdout


@pytest.mark.parametrize("name", ["jodl-mail/x.eml", "jodl-up-login.txt", ".jodl-up.json"])
def test_files_jodl_up_leaves_are_ignored_by_git(name):
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", name], cwd=ROOT, capture_output=True
    )
    assert done.returncode == 0, f"{name} is not in .gitignore"
