"""Settings read from ``JODL_*`` environment variables and an optional TOML file.

Every option is declared once, in :data:`OPTIONS` (library) or by an application
with :class:`Option`; the README's configuration table is printed from the same
declarations by ``jodl config``. Values from the environment win over the file
named by ``JODL_CONFIG``; a bad value raises :class:`ConfigError` naming the variable.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError
from .options import (
    Option,
    host_port,
    listen_address,
    load_declared_options,
    read_file,
    registered_checks,
    registered_options,
)
from .options import markdown_table as options_table

#: Default database: a SQLite file in the working directory.
DEFAULT_DATABASE_URL = "sqlite:///jodl.db"
#: Default address an agent listens on (authenticated like any other address).
DEFAULT_AGENT_LISTEN = "127.0.0.1:18861"
#: Default number of job slots (threads) on an agent.
DEFAULT_SLOTS = 4
#: Seconds a single rpyc call may take before the peer counts as hung: the master's
#: give-up time. A node whose call times out is given up, its executions recorded lost.
DEFAULT_CALL_TIMEOUT = 10.0
#: Unless set, an agent detaches after this share of the master's give-up time (which
#: the master tells it in ``init``): silent for longer, it starts nothing it was sent
#: before. Shorter than the give-up, so a frozen or cut-off agent has
#: stopped starting jobs before the master runs them elsewhere.
DETACH_SHARE = 0.5
#: Seconds an agent keeps a family fenced at the epoch of a leader it no longer hears
#: from; then any master may lead the family there again (docs/architecture.md,
#: "Forged epochs"). Longer than a lease TTL plus a call timeout: by then a master
#: that lost its lease has stopped dispatching.
DEFAULT_FENCE_HOLD = 60.0
#: Attempts of one job in one run before it is declared dead.
DEFAULT_MAX_ATTEMPTS = 3
#: Jobs sent to one agent in one call at most, and held on it: a cap that only jobs of
#: well under a millisecond reach (the rest are sent by the work they queue). 5,000
#: made half the loop steps of 2,000 in a cycle of 100,000 no-op jobs on two agents:
#: the master's CPU a job 36-44 µs against 40-47, 15,000-18,300 jobs/s against
#: 13,800-16,700 (four alternating pairs of bench/throughput.py's first cycle).
DEFAULT_BATCH_SIZE = 5000
#: Jobs of a run a master reads at once: it holds about this many of a large run.
DEFAULT_RUN_WINDOW = 50_000
#: Longest pause of the master loop when nothing happens (seconds).
DEFAULT_IDLE_SLEEP = 0.05
#: Seconds a master's leadership lease lasts without renewal. Renewed every third of
#: it; a leader that could not renew for two thirds of it stops dispatching, so a
#: standby may take over after at most one TTL (see docs/architecture.md).
DEFAULT_LEASE_TTL = 5.0
#: Default address of the master's health/metrics endpoint (loopback; empty: off).
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
#: Default address of an agent's health/metrics endpoint (loopback; empty: off). A
#: second agent on the host finds it taken, says so, and runs without one: give each
#: agent its own with JODL_AGENT_METRICS_LISTEN.
DEFAULT_AGENT_METRICS_LISTEN = "127.0.0.1:9465"
#: Longest backoff between two tries to reach an unreachable node (seconds).
DEFAULT_NODE_BACKOFF_MAX = 60.0
#: Longest pause between two hellos of a detached agent (seconds): a master that comes
#: back hears from every agent within this, and 1,000 agents send it ~30 hellos a second.
DEFAULT_HELLO_BACKOFF_MAX = 30.0
#: Seconds a node whose calls fail may stay silent (suspect: no new jobs, retried
#: with backoff) before it is gone and its jobs run elsewhere, counted from the last
#: call it may have heard. Long enough for three or four reconnects (backoff 0.5, 1,
#: 2 s) to ride over an agent restart or a network blip without rerunning its work;
#: no longer than JODL_CALL_TIMEOUT, so a hung agent (silent for a whole timeout when
#: its call fails) is gone at once: it costs the cycle one call timeout. Equal to
#: the agent's default detach time (half the call timeout): a node is never gone
#: before its agent has detached and stopped starting what it was sent.
DEFAULT_NODE_GRACE = 5.0
#: Shortest accepted JODL_SECRET (characters): 128 bits as URL-safe base64, e.g.
#: ``python -c "import secrets; print(secrets.token_urlsafe(32))"`` (43 characters).
MIN_SECRET_LENGTH = 22
#: How a node key begins (``jodl node key ADDRESS`` prints one; see jodl.agent.keys).
NODE_KEY_PREFIX = "jodlnode1."
#: Seconds a peer has for the whole handshake (TLS, banner, HMAC challenge).
DEFAULT_HANDSHAKE_TIMEOUT = 5.0
#: Connections an agent lets sit in the handshake at once; more are closed at once.
DEFAULT_HANDSHAKE_LIMIT = 16

OPTIONS: tuple[Option, ...] = (
    Option(
        "JODL_CONFIG",
        "",
        "str?",
        "Optional TOML file with any of these settings "
        "(keys without the JODL_ prefix, any case); the environment wins",
        "all",
    ),
    Option(
        "JODL_DATABASE_URL",
        DEFAULT_DATABASE_URL,
        "str",
        "SQLAlchemy URL of the "
        "reconstruction log (sqlite:///FILE or postgresql+psycopg://USER@HOST/DB)",
        "all",
    ),
    Option(
        "JODL_SECRET",
        "",
        "str?",
        "Shared secret of masters and agents (mutual HMAC handshake, every frame "
        f"authenticated), at least {MIN_SECRET_LENGTH} random characters; "
        "an agent needs it or TLS, on loopback too",
        "master, agent",
    ),
    Option(
        "JODL_SECRET_PREVIOUS",
        "",
        "str?",
        "The secret before a rotation: masters also accept agents keyed by it, until every "
        "agent has its new key (docs/operations.md, rotating credentials)",
        "master",
    ),
    Option(
        "JODL_NODE_KEY",
        "",
        "str?",
        "This agent's own key, printed by `jodl node key ADDRESS` on a master host (or "
        "`jodl agent --key-file`): it serves and says hello with it, and cannot command "
        "other agents; instead of JODL_SECRET on agents",
        "agent",
    ),
    Option(
        "JODL_HANDSHAKE_TIMEOUT",
        str(DEFAULT_HANDSHAKE_TIMEOUT),
        "float+",
        "Seconds a peer has for the whole authentication handshake (one deadline)",
        "master, agent",
    ),
    Option(
        "JODL_HANDSHAKE_LIMIT",
        str(DEFAULT_HANDSHAKE_LIMIT),
        "int+",
        "Connections an agent lets sit in the handshake at once; more are closed at once",
        "agent",
    ),
    Option(
        "JODL_TLS_CERT", "", "str?", "PEM certificate of this process (mutual TLS)", "master, agent"
    ),
    Option(
        "JODL_TLS_KEY", "", "str?", "PEM private key of this process (mutual TLS)", "master, agent"
    ),
    Option(
        "JODL_TLS_CA",
        "",
        "str?",
        "PEM of the private CA that signs peers' certificates",
        "master, agent",
    ),
    Option(
        "JODL_AGENT_LISTEN",
        DEFAULT_AGENT_LISTEN,
        "host:port",
        "Address an agent listens on",
        "agent",
    ),
    Option(
        "JODL_AGENT_SLOTS",
        str(DEFAULT_SLOTS),
        "int+",
        "Jobs an agent runs at once (threads for sync families)",
        "agent",
    ),
    Option(
        "JODL_AGENT_ASYNC_SLOTS",
        "200",
        "int+",
        "Jobs of async families an agent runs at once on its event loop",
        "agent",
    ),
    Option(
        "JODL_AGENT_LOOP",
        "auto",
        "loop",
        "Event loop for async families: uvloop, asyncio, or auto (uvloop when installed)",
        "agent",
    ),
    Option(
        "JODL_AGENT_SPEED",
        "1.0",
        "float+",
        "Divides sleep-style example jobs' durations "
        "(to emulate faster or slower nodes in tests and benchmarks)",
        "agent",
    ),
    Option(
        "JODL_CALL_TIMEOUT",
        str(DEFAULT_CALL_TIMEOUT),
        "float+",
        "Seconds one rpyc call may take before the agent counts as hung: the master's "
        "give-up time (its executions there are recorded lost and run elsewhere); "
        "must be longer than JODL_AGENT_DETACH",
        "master",
    ),
    Option(
        "JODL_AGENT_DETACH",
        "",
        "float+?",
        "Seconds without a word from the master after which an agent starts nothing it "
        "was sent before, until the master connects again and cancels what it gave up; "
        "must be shorter than the master's JODL_CALL_TIMEOUT (empty: half of it)",
        "master, agent",
    ),
    Option(
        "JODL_AGENT_FENCE_HOLD",
        str(DEFAULT_FENCE_HOLD),
        "float+",
        "Seconds an agent keeps a family fenced at the epoch of a leader it no longer "
        "hears from (a forged epoch lapses so); longer than the masters' "
        "JODL_LEASE_TTL plus JODL_CALL_TIMEOUT",
        "agent",
    ),
    Option(
        "JODL_AGENT_HELLO_BACKOFF_MAX",
        str(DEFAULT_HELLO_BACKOFF_MAX),
        "float+",
        "Longest pause between two hellos of a detached agent to its masters (seconds; "
        "the pauses double up to it, with jitter)",
        "agent",
    ),
    Option(
        "JODL_MAX_ATTEMPTS",
        str(DEFAULT_MAX_ATTEMPTS),
        "int+",
        "Attempts of a job in one run before it is dead (a family may override)",
        "master",
    ),
    Option(
        "JODL_BATCH_SIZE",
        str(DEFAULT_BATCH_SIZE),
        "int+",
        "Most jobs sent to one agent in one call",
        "master",
    ),
    Option(
        "JODL_RUN_WINDOW",
        str(DEFAULT_RUN_WINDOW),
        "int+",
        "Jobs of a run read at once: a master holds about this many of a large run "
        "(about 1 KB each), and orders them longest first among themselves",
        "master",
    ),
    Option(
        "JODL_IDLE_SLEEP",
        str(DEFAULT_IDLE_SLEEP),
        "float+",
        "Longest pause of the master loop when nothing happened (seconds)",
        "master",
    ),
    Option(
        "JODL_LEASE_TTL",
        str(DEFAULT_LEASE_TTL),
        "float+",
        "Seconds a master's leadership lasts unrenewed; standbys take over after it",
        "master",
    ),
    Option(
        "JODL_NODE_BACKOFF_MAX",
        str(DEFAULT_NODE_BACKOFF_MAX),
        "float+",
        "Longest backoff between tries to reach an unreachable node (seconds)",
        "master",
    ),
    Option(
        "JODL_NODE_GRACE",
        str(DEFAULT_NODE_GRACE),
        "float+",
        "Seconds a node whose calls fail may stay silent (suspect: no new jobs, retried) "
        "before it is gone and its jobs run elsewhere; never before its agent detached",
        "master",
    ),
    Option(
        "JODL_REGISTER_LISTEN",
        "",
        "str?",
        "HOST:PORT where the master accepts agents' one-shot hello (off when empty)",
        "master",
    ),
    Option("JODL_LOG_LEVEL", "INFO", "level", "Logging level", "all"),
    # -- operations: logs for machines, health and metrics endpoints (docs/operations.md)
    Option(
        "JODL_LOG_FORMAT",
        "text",
        "logfmt",
        "Log records as text lines, or json: one object per record with time, level, "
        "role, run_id, family, node and job where known",
        "all",
    ),
    Option(
        "JODL_TRACES",
        "none",
        "traces",
        "OpenTelemetry traces, one per job (add, dispatch, run, commit): none, otlp "
        "(OTEL_EXPORTER_OTLP_* say where), console, or file:PATH (JSON lines); needs "
        "pip install 'jodl[otel]'",
        "all",
    ),
    Option(
        "JODL_METRICS_LISTEN",
        DEFAULT_METRICS_LISTEN,
        "str?",
        "HOST:PORT where the master serves /healthz, /readyz, /metrics and "
        "/debug/profile over HTTP (off when empty; port 0: any free port, published "
        "in the master's heartbeat)",
        "master",
    ),
    Option(
        "JODL_PROFILING",
        "false",
        "bool",
        "Serve /debug/profile on the ops endpoint (then an ops address that is taken "
        "stops the process at start instead of a warning)",
        "master, agent",
    ),
    Option(
        "JODL_OPS_TOKEN",
        "",
        "str?",
        "Token `jodl profile` sends to an ops endpoint (empty: derived from the process's "
        "JODL_NODE_KEY or JODL_SECRET, which never leave it)",
        "master, agent",
    ),
    Option(
        "JODL_AGENT_METRICS_LISTEN",
        DEFAULT_AGENT_METRICS_LISTEN,
        "str?",
        "HOST:PORT where an agent serves /healthz, /metrics and /debug/profile "
        "over HTTP (off when empty; port 0: any free port, told to its masters)",
        "agent",
    ),
)


def read_values(options: Iterable[Option], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Parse ``options`` from ``env`` (default ``os.environ``) and the optional config file."""
    env = os.environ if env is None else env
    options = tuple(options)
    file_values = read_file(env["JODL_CONFIG"]) if env.get("JODL_CONFIG") else {}
    if file_values:
        # Only here are every package's options needed (to refuse the names none
        # declares): importing each package's settings takes a good part of a second.
        known = {opt.name for opt in options} | {opt.name for opt in all_options()}
        for name in file_values:
            if name not in known:
                raise ConfigError(f"JODL_CONFIG: unknown setting {name!r}")
    values: dict[str, Any] = {}
    for opt in options:
        if opt.name in env:
            values[opt.attr] = opt.parse(env[opt.name])
        elif opt.name in file_values:
            try:
                values[opt.attr] = opt.parse(file_values[opt.name])
            except ConfigError as exc:
                raise ConfigError(f"{exc} (set in {env['JODL_CONFIG']})") from None
        else:
            values[opt.attr] = opt.parse(opt.default)
    return values


@dataclass(frozen=True)
class Settings:
    """The library's settings; build with :meth:`from_env`."""

    config: str | None = None
    database_url: str = DEFAULT_DATABASE_URL
    secret: str | None = None
    secret_previous: str | None = None
    node_key: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    handshake_limit: int = DEFAULT_HANDSHAKE_LIMIT
    agent_listen: str = DEFAULT_AGENT_LISTEN
    agent_slots: int = DEFAULT_SLOTS
    agent_async_slots: int = 200
    agent_loop: str = "auto"
    agent_speed: float = 1.0
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    agent_detach: float | None = None
    agent_hello_backoff_max: float = DEFAULT_HELLO_BACKOFF_MAX
    agent_fence_hold: float = DEFAULT_FENCE_HOLD
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    batch_size: int = DEFAULT_BATCH_SIZE
    run_window: int = DEFAULT_RUN_WINDOW
    idle_sleep: float = DEFAULT_IDLE_SLEEP
    lease_ttl: float = DEFAULT_LEASE_TTL
    node_backoff_max: float = DEFAULT_NODE_BACKOFF_MAX
    node_grace: float = DEFAULT_NODE_GRACE
    register_listen: str | None = None
    log_level: str = "INFO"
    # operations
    log_format: str = "text"
    traces: str = "none"
    metrics_listen: str | None = DEFAULT_METRICS_LISTEN
    agent_metrics_listen: str | None = DEFAULT_AGENT_METRICS_LISTEN
    profiling: bool = False
    ops_token: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        values = read_values(OPTIONS, env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.validate()
        return settings

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        tls = (self.tls_cert, self.tls_key, self.tls_ca)
        if any(tls) and not all(tls):
            raise ConfigError("JODL_TLS_CERT, JODL_TLS_KEY and JODL_TLS_CA: set all three or none")
        if self.agent_detach is not None and self.agent_detach >= self.call_timeout:
            raise ConfigError(
                f"JODL_AGENT_DETACH ({self.agent_detach:g}s) must be shorter than "
                f"JODL_CALL_TIMEOUT ({self.call_timeout:g}s): an agent must stop starting "
                "jobs before the master gives them up and runs them elsewhere"
            )
        check_secret(self.secret)
        check_secret(self.secret_previous, "JODL_SECRET_PREVIOUS")
        check_node_key(self.node_key)
        check_secret(self.ops_token, "JODL_OPS_TOKEN")
        for name, address, check in (
            ("JODL_REGISTER_LISTEN", self.register_listen, host_port),
            ("JODL_AGENT_LISTEN", self.agent_listen, host_port),
            # An ops endpoint may take any free port: it publishes the one it bound.
            ("JODL_METRICS_LISTEN", self.metrics_listen, listen_address),
            ("JODL_AGENT_METRICS_LISTEN", self.agent_metrics_listen, listen_address),
        ):
            if address:
                try:
                    check(address)
                except ValueError as exc:
                    raise ConfigError(f"{name}: {exc}") from None

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)


def check_secret(secret: str | None, name: str = "JODL_SECRET") -> None:
    """:class:`ConfigError` when ``secret`` is set but shorter than :data:`MIN_SECRET_LENGTH`."""
    if secret and len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"{name} is too short ({len(secret)} characters): use at least "
            f"{MIN_SECRET_LENGTH} random ones (128 bits), e.g. the output of "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def check_node_key(key: str | None) -> None:
    """:class:`ConfigError` unless ``key`` is empty or a node key as ``jodl node key`` prints."""
    if key and (not key.startswith(NODE_KEY_PREFIX) or len(key) != len(NODE_KEY_PREFIX) + 43):
        raise ConfigError(
            "JODL_NODE_KEY is not a node key: use the line `jodl node key ADDRESS` prints "
            "on a master host (it begins with " + NODE_KEY_PREFIX + ")"
        )


def all_options() -> tuple[Option, ...]:
    """The library's options, then every installed package's (the ``jodl.options`` entry points)."""
    load_declared_options()
    return OPTIONS + registered_options()


#: Words in a variable's name that mark its value as secret: shown as "(set)".
SECRET_WORDS = ("SECRET", "PASSWORD", "TOKEN", "NODE_KEY")

# The password of a URL (``scheme://user:PASSWORD@host``; up to the last "@", so an
# unescaped "@" in it hides more, never less), and a ``password=`` query parameter.
_URL_PASSWORD = re.compile(r"(://[^:/@]*:).*(@)")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def hide_password(text: str) -> str:
    """``text`` with the password of a URL in it shown as ``***`` (to print a database URL)."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***\2", text))


@dataclass(frozen=True)
class Effective:
    """A setting's value in effect (as text) and where it came from."""

    option: Option
    value: str
    source: str  # "environment", "file PATH" or "default"


def effective(env: Mapping[str, str] | None = None) -> list[Effective]:
    """Every option's value in effect and its source, each parsed: :class:`ConfigError`
    (naming the variable) on the first bad one."""
    env = os.environ if env is None else env
    file_values = read_file(env["JODL_CONFIG"]) if env.get("JODL_CONFIG") else {}
    out = []
    for opt in all_options():
        if opt.name in env:
            text, source = env[opt.name], "environment"
        elif opt.name in file_values:
            text, source = file_values[opt.name], f"file {env['JODL_CONFIG']}"
        else:
            text, source = opt.default, "default"
        try:
            opt.parse(text)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (from the {source})") from None
        if text and any(word in opt.name for word in SECRET_WORDS):
            text = "(set)"
        text = hide_password(text)
        out.append(Effective(opt, text, source))
    Settings.from_env(env)  # the checks across settings (e.g. TLS: all three or none)
    for check in registered_checks():  # the applications' own (e.g. JODL_FETCH_ALLOW)
        check(env)
    return out


def markdown_table(options: Iterable[Option] | None = None) -> str:
    """The configuration table of the README (every installed option), in Markdown."""
    return options_table(all_options() if options is None else options)


__all__ = ["OPTIONS", "Settings", "all_options", "hide_password", "read_values"]
