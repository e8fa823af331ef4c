"""Settings: ``JODL_*`` variables, the optional TOML file, and errors that name the variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jodl.exceptions import ConfigError
from jodl.settings import config, options
from jodl.settings.config import OPTIONS, Settings, markdown_table, read_values
from jodl.settings.options import Option


def write_toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "jodl.toml"
    path.write_text(text)
    return str(path)


def test_defaults_of_the_declarations_and_of_the_settings_class_agree():
    assert Settings.from_env(env={}) == Settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("JODL_AGENT_SLOTS", "four"),
        ("JODL_AGENT_SLOTS", "0"),
        ("JODL_AGENT_SLOTS", "-3"),
        ("JODL_AGENT_SLOTS", ""),
        ("JODL_AGENT_ASYNC_SLOTS", "1.5"),
        ("JODL_AGENT_SPEED", "0"),
        ("JODL_AGENT_SPEED", "nan"),
        ("JODL_CALL_TIMEOUT", "soon"),
        ("JODL_MAX_ATTEMPTS", "0"),
        ("JODL_BATCH_SIZE", "1e3"),
        ("JODL_IDLE_SLEEP", "-0.1"),
        ("JODL_NODE_BACKOFF_MAX", "inf-ish"),
        ("JODL_AGENT_LISTEN", "127.0.0.1"),
        ("JODL_AGENT_LISTEN", "127.0.0.1:99999"),
        ("JODL_AGENT_LISTEN", ":8080"),
        ("JODL_REGISTER_LISTEN", "somewhere"),
        ("JODL_LOG_LEVEL", "chatty"),
        ("JODL_AGENT_LOOP", "trio"),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str):
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env={name: value})
    assert str(caught.value).startswith(f"{name}: "), caught.value
    assert "\n" not in str(caught.value)


def test_tls_needs_all_three_files():
    with pytest.raises(ConfigError, match="JODL_TLS_CERT, JODL_TLS_KEY and JODL_TLS_CA"):
        Settings.from_env(env={"JODL_TLS_CERT": "c.pem", "JODL_TLS_CA": "ca.pem"})
    tls = Settings.from_env(
        env={"JODL_TLS_CERT": "c.pem", "JODL_TLS_KEY": "k.pem", "JODL_TLS_CA": "ca.pem"}
    )
    assert tls.tls


def test_values_are_parsed_to_their_types():
    settings = Settings.from_env(
        env={
            "JODL_AGENT_SLOTS": "8",
            "JODL_AGENT_SPEED": "2.5",
            "JODL_SECRET": "s3cret-s3cret-s3cret-s3cret",
            "JODL_LOG_LEVEL": "debug",
            "JODL_AGENT_LISTEN": "[::1]:9000",
        }
    )
    assert settings.agent_slots == 8 and settings.agent_speed == 2.5
    assert settings.secret == "s3cret-s3cret-s3cret-s3cret" and settings.log_level == "DEBUG"
    assert settings.agent_listen == "[::1]:9000"
    assert Settings.from_env(env={"JODL_SECRET": ""}).secret is None


def test_a_short_secret_is_refused_naming_the_variable():
    with pytest.raises(ConfigError, match="JODL_SECRET is too short"):
        Settings.from_env(env={"JODL_SECRET": "correct horse"})


def test_the_toml_file_sets_values(tmp_path: Path):
    path = write_toml(
        tmp_path,
        'agent_slots = 7\nJODL_CALL_TIMEOUT = 2.5\nSecret = "from-file-from-file-from-file"\n'
        'log_level = "warning"\n',
    )
    settings = Settings.from_env(env={"JODL_CONFIG": path})
    assert settings.agent_slots == 7
    assert settings.call_timeout == 2.5
    assert settings.secret == "from-file-from-file-from-file"
    assert settings.log_level == "WARNING"
    assert settings.config == path


def test_the_environment_wins_over_the_file(tmp_path: Path):
    path = write_toml(tmp_path, "agent_slots = 7\nmax_attempts = 5\n")
    settings = Settings.from_env(env={"JODL_CONFIG": path, "JODL_AGENT_SLOTS": "3"})
    assert settings.agent_slots == 3, "environment"
    assert settings.max_attempts == 5, "file"
    assert settings.batch_size == Settings().batch_size, "default"


def test_explicit_overrides_win_over_everything(tmp_path: Path):
    path = write_toml(tmp_path, 'database_url = "sqlite:///file.db"\n')
    env = {"JODL_CONFIG": path, "JODL_DATABASE_URL": "sqlite:///env.db"}
    assert Settings.from_env(env=env).database_url == "sqlite:///env.db"
    assert Settings.from_env(env=env, database_url="sqlite:///cli.db").database_url == (
        "sqlite:///cli.db"
    )


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("agent_slots = 0\n", ("JODL_AGENT_SLOTS", "jodl.toml")),
        ("no_such_setting = 1\n", ("JODL_CONFIG", "JODL_NO_SUCH_SETTING")),
        ("agent_slots = \n", ("JODL_CONFIG", "not valid TOML")),
        ("[agent]\nslots = 2\n", ("JODL_CONFIG", "table")),
    ],
)
def test_a_bad_file_is_named(tmp_path: Path, text: str, needles: tuple[str, ...]):
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env={"JODL_CONFIG": path})
    for needle in needles:
        assert needle in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path):
    with pytest.raises(ConfigError, match="JODL_CONFIG: no such file"):
        Settings.from_env(env={"JODL_CONFIG": str(tmp_path / "absent.toml")})


def test_application_options_read_the_same_way(tmp_path: Path):
    options = (
        Option("JODL_TEST_FLAG", "off", "bool", "a flag", "test"),
        Option("JODL_TEST_HOSTS", "", "list", "some hosts", "test"),
        Option("JODL_TEST_RATIO", "0.5", "fraction", "a ratio", "test"),
    )
    assert read_values(options, env={}) == {"test_flag": False, "test_hosts": (), "test_ratio": 0.5}
    path = write_toml(tmp_path, 'test_flag = true\ntest_hosts = ["a.org", "b.org"]\n')
    values = read_values(options, env={"JODL_CONFIG": path, "JODL_TEST_RATIO": "1"})
    assert values == {"test_flag": True, "test_hosts": ("a.org", "b.org"), "test_ratio": 1.0}
    for env, name in (
        ({"JODL_TEST_FLAG": "maybe"}, "JODL_TEST_FLAG"),
        ({"JODL_TEST_RATIO": "1.5"}, "JODL_TEST_RATIO"),
    ):
        with pytest.raises(ConfigError, match=f"^{name}: "):
            read_values(options, env=env)


def test_the_configuration_table_lists_every_library_option():
    table = markdown_table(OPTIONS)
    for opt in OPTIONS:
        assert f"| `{opt.name}` |" in table


def test_the_table_order_does_not_depend_on_the_import_order(monkeypatch):
    def option(name: str) -> Option:
        return Option(name, "", "str", "a test option", "test")

    def table_after(registrations: list[tuple[str, list[str]]]) -> list[str]:
        monkeypatch.setattr(options, "_EXTRA", {})
        monkeypatch.setattr(options, "_declared_loaded", True)  # only these registrations
        for module, names in registrations:
            options.register_options([option(n) for n in names], module)
        return [o.name for o in config.all_options()[len(OPTIONS) :]]

    web = ("web.settings", ["JODL_TEST_W2", "JODL_TEST_W1"])
    app = ("crawler_app.settings", ["JODL_TEST_C"])
    lib = ("jodl.queue", ["JODL_TEST_Q"])
    expected = ["JODL_TEST_Q", "JODL_TEST_C", "JODL_TEST_W2", "JODL_TEST_W1"]
    assert table_after([web, app, lib]) == expected
    assert table_after([lib, app, web]) == expected
    assert table_after([app, web, lib]) == expected
    # A name already declared keeps its first place.
    assert table_after([lib, app, web, ("web.other", ["JODL_TEST_Q"])]) == expected


def test_every_installed_package_declares_its_options_without_being_imported_first():
    """``jodl.options`` entry points: a fresh process that imported none of the declaring
    modules still sees the library's queue and budget options in the table."""
    script = (
        "import sys; from jodl.settings.config import all_options; "
        "assert 'jodl.queue' not in sys.modules; "
        "print(' '.join(o.name for o in all_options()))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert {"JODL_QUEUE_LEASE", "JODL_FAMILY_JOBS_PER_CYCLE"} <= set(done.stdout.split())
