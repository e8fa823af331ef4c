"""Every user-facing failure of ``jodl``: one clear line, a non-zero exit, nothing half-written."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from agents import TEST_SECRET, free_port, run_jodl
from click.testing import CliRunner
from sqlalchemy import func, select

from jodl.cli import main
from jodl.log import Store
from jodl.log.models import FamilyRow, Job, Run


@dataclass
class Outcome:
    """Exit code and output of one ``jodl`` invocation (subprocess or in-process)."""

    code: int
    stdout: str
    stderr: str


def jodl(*args: str, env: dict[str, str], process: bool = False) -> Outcome:
    """Run ``jodl ARGS``: in a subprocess (the real program) or in this process.

    In this process the real click group runs too, without the interpreter start-up
    that dominates a subprocess; ``JODL_*`` variables of the caller are cleared, and
    the test secret is set, as for a subprocess (:func:`agents.child_env`).
    """
    if process:
        done = run_jodl(*args, env=env, timeout=60)
        return Outcome(done.returncode, done.stdout, done.stderr)
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("JODL_")}
    result = CliRunner().invoke(main, list(args), env={**clean, "JODL_SECRET": TEST_SECRET, **env})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # an uncaught error: a subprocess would print a traceback
    return Outcome(result.exit_code, result.stdout, result.stderr)


def one_line_error(result: Outcome, *needles: str) -> str:
    """Assert ``result`` failed with exactly one ``error:`` line containing ``needles``."""
    assert result.code != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    for needle in needles:
        assert needle in line, line
    return line


def usage_error(result: Outcome, *needles: str) -> None:
    """click's own usage errors: exit 2, an ``Error:`` line naming the problem, no traceback."""
    assert result.code == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    for needle in needles:
        assert needle in error, error


def counts(store: Store) -> tuple[int, int]:
    with store.engine.connect() as conn:
        return (
            conn.scalar(select(func.count()).select_from(FamilyRow)),
            conn.scalar(select(func.count()).select_from(Job)),
        )


def test_unknown_family_writes_nothing(store, db_url):
    env = {"JODL_DATABASE_URL": db_url}
    one_line_error(jodl("jobs", "add", "nosuch", env=env, process=True), "unknown family")
    assert counts(store) == (0, 0)
    # The same command with a real family writes: the check above could fail.
    ok = jodl("jobs", "add", "noop", "--count", "3", env=env)
    assert ok.code == 0, ok.stderr
    assert counts(store) == (1, 3)


@pytest.mark.parametrize(
    ("payload", "needle"), [("{bad", "not JSON"), ("[1, 2]", "must be a JSON object")]
)
def test_bad_payload_writes_nothing(store, db_url, payload, needle):
    env = {"JODL_DATABASE_URL": db_url}
    result = jodl("jobs", "add", "noop", "--payload", payload, env=env, process=True)
    usage_error(result, "--payload", needle)
    assert counts(store) == (0, 0)


def test_unreachable_database():
    url = "postgresql+psycopg://nobody@127.0.0.1:1/x"
    line = one_line_error(
        jodl("status", env={"JODL_DATABASE_URL": url}, process=True), "cannot reach the database"
    )
    assert "127.0.0.1:1" in line


def test_sqlite_file_in_a_missing_directory(tmp_path):
    url = f"sqlite:///{tmp_path / 'missing' / 'jodl.db'}"
    one_line_error(jodl("status", env={"JODL_DATABASE_URL": url}), "no database at")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("args", [("status",), ("node", "list"), ("tracked",), ("admins", "list")])
def test_a_read_creates_no_database(tmp_path, args):
    path = tmp_path / "jodl.db"
    one_line_error(
        jodl(*args, env={"JODL_DATABASE_URL": f"sqlite:///{path}"}),
        f"no database at {path}",
        "jodl db upgrade",
    )
    assert not path.exists()


def test_an_unsupported_database_url_is_one_line(tmp_path):
    result = jodl("status", env={"JODL_DATABASE_URL": "mysql://u@127.0.0.1/x"}, process=True)
    one_line_error(result, "JODL_DATABASE_URL", "not a usable database URL")


def test_config_shows_values_in_effect_and_their_source(tmp_path):
    (tmp_path / "jodl.toml").write_text("batch_size = 50\n")
    env = {"JODL_CONFIG": str(tmp_path / "jodl.toml"), "JODL_AGENT_SLOTS": "7"}
    out = jodl("config", env=env)
    assert out.code == 0, out.stderr
    rows = {line.split()[0]: line.split(None, 1)[1] for line in out.stdout.splitlines()}
    assert rows["JODL_AGENT_SLOTS"] == "7  [environment]"
    assert rows["JODL_BATCH_SIZE"] == f"50  [file {tmp_path / 'jodl.toml'}]"
    assert rows["JODL_MAX_ATTEMPTS"] == "3  [default]"


def test_config_hides_secrets():
    secret = "hunter2-but-long-enough-for-128-bits"
    out = jodl("config", env={"JODL_SECRET": secret})
    assert out.code == 0, out.stderr
    assert secret not in out.stdout and "JODL_SECRET" in out.stdout


def test_config_refuses_a_short_secret_without_echoing_it():
    out = jodl("config", env={"JODL_SECRET": "hunter2"})
    assert out.code != 0 and "JODL_SECRET is too short" in out.stderr
    assert "hunter2" not in out.stderr + out.stdout


def test_config_checks_every_setting():
    line = one_line_error(jodl("config", env={"JODL_AGENT_SLOTS": "many"}), "JODL_AGENT_SLOTS")
    assert "expected a positive integer, got 'many'" in line


@pytest.mark.parametrize("args", [("status",), ("run", "noop"), ("node", "list")])
def test_a_database_without_tables_says_to_upgrade(tmp_path, args):
    env = {"JODL_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"}
    one_line_error(jodl(*args, env=env), "jodl db upgrade")


def test_run_of_a_family_without_jobs(store, db_url):
    one_line_error(jodl("run", "nosuch", env={"JODL_DATABASE_URL": db_url}), "no family 'nosuch'")


def test_removing_an_unknown_node(store, db_url):
    one_line_error(
        jodl("node", "remove", "127.0.0.1:9", env={"JODL_DATABASE_URL": db_url}),
        "no node '127.0.0.1:9'",
    )


def test_node_address_must_be_host_port(store, db_url):
    usage_error(jodl("node", "add", "no-port", env={"JODL_DATABASE_URL": db_url}), "HOST:PORT")


def test_a_port_already_in_use(spawn_agent):
    first = spawn_agent()
    result = jodl("agent", "--listen", first.address, env={}, process=True)
    one_line_error(result, f"cannot listen on {first.address}", "in use")
    assert first.alive(), "the agent already listening is untouched"


@pytest.mark.parametrize(
    ("env", "args", "variable"),
    [
        ({"JODL_AGENT_SLOTS": "abc"}, ("agent",), "JODL_AGENT_SLOTS"),
        ({"JODL_AGENT_SLOTS": "0"}, ("agent",), "JODL_AGENT_SLOTS"),
        ({"JODL_AGENT_SPEED": "fast"}, ("agent",), "JODL_AGENT_SPEED"),
        ({"JODL_AGENT_LISTEN": "nowhere"}, ("agent",), "JODL_AGENT_LISTEN"),
        ({"JODL_CALL_TIMEOUT": "-1"}, ("status",), "JODL_CALL_TIMEOUT"),
        ({"JODL_MAX_ATTEMPTS": "many"}, ("status",), "JODL_MAX_ATTEMPTS"),
        ({"JODL_LOG_LEVEL": "loud"}, ("status",), "JODL_LOG_LEVEL"),
        ({"JODL_DATABASE_URL": "nonsense"}, ("status",), "JODL_DATABASE_URL"),
        ({"JODL_DATABASE_URL": "nosuchdb://x/y"}, ("status",), "JODL_DATABASE_URL"),
        ({"JODL_CONFIG": "/nonexistent/jodl.toml"}, ("status",), "JODL_CONFIG"),
        ({"JODL_TLS_CERT": "/tmp/cert.pem"}, ("agent",), "JODL_TLS_KEY"),
        ({"JODL_REGISTER_LISTEN": "nope"}, ("status",), "JODL_REGISTER_LISTEN"),
    ],
)
def test_a_bad_setting_names_its_variable(tmp_path, env, args, variable):
    env = {"JODL_DATABASE_URL": f"sqlite:///{tmp_path / 'jodl.db'}", **env}
    one_line_error(jodl(*args, env=env), variable)
    assert not (tmp_path / "jodl.db").exists() or "DATABASE" in variable, "nothing written"


def test_a_bad_setting_in_a_subprocess_is_one_line_too(tmp_path):
    env = {"JODL_DATABASE_URL": f"sqlite:///{tmp_path / 'jodl.db'}", "JODL_AGENT_SLOTS": "x"}
    one_line_error(jodl("agent", env=env, process=True), "JODL_AGENT_SLOTS")


def test_an_agent_with_smtp_credentials_but_no_tls_refuses_to_start(tmp_path):
    """Issue 20: as the README says, every process refuses, the agent too (not only
    its notify jobs): the SMTP password would go over the network in clear."""
    env = {
        "JODL_DATABASE_URL": f"sqlite:///{tmp_path / 'jodl.db'}",
        "JODL_AGENT_LISTEN": f"127.0.0.1:{free_port()}",
        "JODL_SMTP_USER": "jodl",
        "JODL_SMTP_PASSWORD": "smtp-password-77",
    }
    line = one_line_error(jodl("agent", env=env, process=True), "JODL_SMTP_USER", "STARTTLS")
    assert "smtp-password-77" not in line


def test_a_run_without_any_node_says_so_instead_of_waiting(store, db_url):
    store.add_jobs(store.ensure_family("noop"), [("a", "{}")])
    result = jodl("run", "noop", env={"JODL_DATABASE_URL": db_url})
    one_line_error(result, "no agent nodes", "jodl node add")
    with store.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Run)) == 0, "no run opened"


def test_a_run_prints_its_summary_once_and_a_new_run_is_not_resumed(store, db_url, agents):
    store.add_jobs(store.ensure_family("noop"), [(f"k{i}", "{}") for i in range(5)])
    agents(1)
    env = {"JODL_DATABASE_URL": db_url, "JODL_LOG_LEVEL": "INFO"}
    result = jodl("run", "noop", env=env, process=True)
    assert result.code == 0, result.stderr
    output = result.stdout + result.stderr
    assert output.count("run noop#1") == 1, output
    assert "resumed" not in output


def test_jobs_from_a_file_with_bad_lines_adds_nothing(store, db_url, tmp_path):
    lines = [
        '{"key": "a", "payload": {"seconds": 0}}',
        "not json",
        '{"key": "b", "payload": [1]}',
        "",
        '{"key": "a"}',
        '{"payload": {}}',
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    env = {"JODL_DATABASE_URL": db_url}
    line = one_line_error(
        jodl("jobs", "add", "sleep", "--from", str(path), env=env), "no job added"
    )
    for needle in (
        "line 2: not JSON",
        "line 3: payload",
        "line 5: key 'a' repeats line 1",
        "line 6",
    ):
        assert needle in line, line
    assert counts(store) == (0, 0), "nothing half-added"


def test_jobs_from_a_file_and_their_results(store, db_url, tmp_path):
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"key": "x", "payload": {"seconds": 0}}\n{"key": "y"}\n')
    env = {"JODL_DATABASE_URL": db_url}
    out = jodl("jobs", "add", "sleep", "--from", str(path), env=env)
    assert out.code == 0 and out.stdout.strip() == "2 jobs added to sleep", out.stderr
    fam = store.family("sleep")
    with store.session() as s:
        payloads = dict(
            s.execute(select(Job.key, Job.payload).where(Job.family_id == fam.id)).all()
        )
    assert payloads == {"x": '{"seconds": 0}', "y": "{}"}
    one_line_error(jodl("results", "sleep", env=env), "no results", "'sleep' has no run")


def test_a_bad_line_deep_in_a_large_file_is_named_and_the_file_added_once(store, db_url, tmp_path):
    """A large file is all or nothing: one bad line among 20,000 names its number and
    adds no job; fixed, the file is added whole, and adding it again adds none."""
    lines = [f'{{"key": "k{i}", "payload": {{"seconds": {i % 3}}}}}' for i in range(20_000)]
    good = lines[12_345]
    lines[12_345] = '{"key": "k12345", "payload": {"seconds": 0}'  # the closing brace lost
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    env = {"JODL_DATABASE_URL": db_url}
    line = one_line_error(jodl("jobs", "add", "sleep", "--from", str(path), env=env))
    assert "1 bad line(s), no job added: line 12346: not JSON" in line, line
    assert counts(store)[1] == 0, "nothing half-added"
    lines[12_345] = good
    path.write_text("\n".join(lines) + "\n")
    out = jodl("jobs", "add", "sleep", "--from", str(path), env=env)
    assert out.stdout.strip() == "20000 jobs added to sleep", out.stderr
    out = jodl("jobs", "add", "sleep", "--from", str(path), env=env)
    assert out.stdout.strip() == "0 jobs added to sleep (20000 keys existed)", out.stderr
    assert counts(store)[1] == 20_000
    with store.session() as s:
        assert s.scalar(select(Job.payload).where(Job.key == "k12345")) == '{"seconds": 0}'


def test_libraries_log_warnings_only_unless_debug():
    import logging

    from jodl.cli.context import configure_logging

    configure_logging("INFO")
    assert logging.getLogger("apscheduler.scheduler").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("waitress").getEffectiveLevel() == logging.WARNING
    configure_logging("DEBUG")
    assert logging.getLogger("apscheduler").level == logging.NOTSET  # as the root says
