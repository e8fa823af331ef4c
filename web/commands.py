"""The web UI's ``jodl`` commands: ``web`` (serve the UI), ``up`` (the whole system), ``admins``.

Installed through the entry point group ``jodl.commands`` (the library never
imports this package): :func:`register` receives the ``jodl`` click group.

``jodl web`` serves the app with waitress, a production WSGI server with a pool
of threads; an open event stream holds one thread, and streams may take at most
``JODL_WEB_MAX_STREAMS`` of them, so ordinary pages always find a free thread.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from jodl.cli.context import (
    configure_logging,
    missing_sqlite_file,
    sigterm_as_interrupt,
    store_of,
)
from jodl.exceptions import JodlError
from jodl.settings.config import hide_password

if TYPE_CHECKING:
    from .settings import WebSettings

log = logging.getLogger("web")

#: Seconds waitress keeps an idle connection (streams send keep-alives more often).
CHANNEL_TIMEOUT = 120


def make_server(app: Any, settings: WebSettings, listen: str | None = None) -> Any:
    """A waitress server for ``app`` on ``listen`` (HOST:PORT; port 0: any free one)."""
    from waitress.server import create_server  # type: ignore[import-untyped]

    from jodl.agent import split_address

    address = listen or settings.web_listen
    try:
        host, port = split_address(address)
    except ValueError as exc:
        raise JodlError(f"--listen: {exc}") from None
    try:
        return create_server(
            app,
            host=host,
            port=port,
            threads=settings.web_threads,
            channel_timeout=CHANNEL_TIMEOUT,
            connection_limit=max(100, 4 * settings.web_threads),
            ident="jodl",
            clear_untrusted_proxy_headers=True,
            **proxy_options(settings.web_proxies),
            # Reads ahead while a request runs, so a stream learns at once that its
            # client disconnected (waitress.client_disconnected) and frees its slot.
            channel_request_lookahead=1,
        )
    except OSError as exc:
        raise JodlError(f"cannot listen on {address}: {exc.strerror or exc}") from None


def proxy_options(proxies: int) -> dict[str, Any]:
    """waitress's trust in the X-Forwarded-For/-Proto of ``JODL_WEB_PROXIES`` proxies.

    Without it waitress strips those headers (``clear_untrusted_proxy_headers``), and
    every client would be the proxy's address: one lockout, one rate limit and
    loopback-only ``/metrics`` for all. waitress keeps the last ``proxies`` hops of
    X-Forwarded-For, from which the app's ProxyFix takes the same client address
    (the app may run under another WSGI server too). The web server must then be
    reachable only through the proxies: a client that reaches it directly names
    its own address.
    """
    if not proxies:
        return {}
    return {
        "trusted_proxy": "*",
        "trusted_proxy_count": proxies,
        "trusted_proxy_headers": {"x-forwarded-for", "x-forwarded-proto"},
    }


def server_url(server: Any) -> str:
    host = server.effective_host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{server.effective_port}/"


def serve(
    server: Any, stopping: threading.Event, on_stop: Callable[[], None] | None = None
) -> None:
    """Serve until SIGINT/SIGTERM (or ``stopping`` is set by someone else); then return.

    Open event streams end at once (``stopping``), so the server's threads finish.
    """

    asked = threading.Event()  # a signal arrived (or is on its way)

    def interrupt(_signum: int, _frame: Any) -> None:
        asked.set()
        stopping.set()
        raise KeyboardInterrupt

    def watch() -> None:
        # Someone else asked to stop (e.g. the master failed): interrupt the server's loop.
        stopping.wait()
        if not asked.is_set():
            asked.set()
            os.kill(os.getpid(), signal.SIGINT)

    previous: dict[int, Any] = {}
    try:
        # Inside the try: a signal that lands as the handlers go in still stops cleanly.
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, interrupt)
        threading.Thread(target=watch, name="jodl-web-stop", daemon=True).start()
        server.run()  # returns after KeyboardInterrupt (waitress shuts its threads down)
    except KeyboardInterrupt:
        pass
    finally:
        asked.set()
        stopping.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if on_stop is not None:
            on_stop()


def _check_schema(engine: Any) -> None:
    from . import queries

    if not queries.has_web_tables(engine):
        raise JodlError("the database has no web UI tables; run: jodl db upgrade")


@click.command("web")
@click.option("--listen", default=None, help="HOST:PORT to serve on (JODL_WEB_LISTEN).")
@click.option("--threads", type=click.IntRange(min=2), default=None, help="Worker threads.")
@click.pass_context
def web_cmd(ctx: click.Context, listen: str | None, threads: int | None) -> None:
    """Serve the web UI and its JSON API (waitress, threads)."""
    from jodl.settings.config import Settings

    from .app import create_app
    from .settings import WebSettings

    obj = ctx.ensure_object(dict)
    settings = WebSettings.from_env(
        database_url=obj.get("database_url"), web_threads=threads, web_listen=listen
    )
    missing = missing_sqlite_file(settings.database_url)
    if missing is not None:
        raise JodlError(f"no database at {missing}: run `jodl db upgrade` or `jodl up`")
    lib = Settings.from_env(database_url=settings.database_url)
    configure_logging(lib.log_level, lib.log_format, "web")
    app = create_app(settings)
    svc = app.extensions["jodl"]
    _check_schema(svc.engine)
    if not settings.web_secret_key:
        log.warning("JODL_WEB_SECRET_KEY is not set: logins end when this process stops")
    server = make_server(app, settings, listen)
    click.echo(f"JODL web UI on {server_url(server)}", err=True)
    serve(server, svc.stopping)


@click.command("up")
@click.option(
    "--listen",
    default=None,
    help="HOST:PORT of the web UI (default 127.0.0.1:8080, or any free port if taken).",
)
@click.option(
    "--agents", type=click.IntRange(min=1, max=32), default=None, help="Local agents (2)."
)
@click.option(
    "--standalone",
    is_flag=True,
    help="One process: master, web UI and an in-process agent (no agent processes).",
)
@click.option(
    "--print-login",
    is_flag=True,
    help="Print the URL and operator login of the jodl up running in this folder, and exit.",
)
@click.pass_context
def up_cmd(
    ctx: click.Context, listen: str | None, agents: int | None, standalone: bool, print_login: bool
) -> None:
    """Run the whole system here: database, master, agents, scheduler and web UI.

    The same database as every other command (JODL_DATABASE_URL, default the
    SQLite file jodl.db in this directory), so `jodl status` beside it sees its
    data. Prints the URL and the operator login last; Ctrl-C stops everything.
    With --standalone the jobs run in this process too (the node local:1).
    """
    from jodl.settings.config import Settings

    from . import instance
    from .app import create_app
    from .cluster import DEFAULT_AGENTS, LocalCluster
    from .settings import WebSettings, up_app_url
    from .standalone import describe
    from .trial import login_line, public_warning, read_login

    if print_login:
        _print_login()
        return
    obj = ctx.ensure_object(dict)
    lib = Settings.from_env(database_url=obj.get("database_url"))
    database = lib.database_url
    if standalone and agents is not None:
        raise JodlError("--agents starts agent processes; --standalone runs none (choose one)")
    if not lib.secret and not standalone:
        # Agents authenticate every peer, on loopback too: a fresh secret for this run
        # (unless JODL_SECRET is set; with TLS alone the agents inherit JODL_TLS_*).
        import secrets

        lib = lib.replace(secret=secrets.token_urlsafe(32))
    configure_logging(lib.log_level, lib.log_format, "web")
    web_settings = WebSettings.for_up(database_url=database, web_listen=listen)
    cluster = LocalCluster(
        database,
        agents=agents or DEFAULT_AGENTS,
        settings=lib,
        # In one process nothing listens on a network: the agent needs no secret.
        agent_env={} if standalone else {"JODL_SECRET": lib.secret or ""},
        standalone=standalone,
    )
    started = False
    sink = None
    # SIGTERM stops like Ctrl-C from here on, also while starting or before serving.
    sigterm_as_interrupt()
    try:
        email, password = cluster.prepare(read_login())
        _refuse_second_master(cluster, database)
        app = create_app(web_settings, engine=cluster.engine)
        server = _up_server(app, web_settings, listen)
        app_url = up_app_url(server_url(server))
        if app_url is not None:
            # Before the master starts: its cycle scheduler reads the page checker's
            # settings once, and the digests it builds link to this UI; the web app
            # reads them per request (its confirmation links).
            os.environ["JODL_APP_URL"] = app_url
        sink = _start_mail_sink(app, cluster)
        cluster.start_agents()
        cluster.start_master()
        started = True
        svc = app.extensions["jodl"]
        login = login_line(email, password)
        shown = hide_password(database)  # printed, and kept for --print-login
        me = instance.Instance(server_url(server), email, login, shown, os.getpid())
        instance.write(me)
        warning = public_warning(server.effective_host)
        if warning:
            click.echo(warning, err=True)
        if cluster.in_process is not None:
            click.echo(describe(cluster.in_process))
        else:
            click.echo(f"  agents: {', '.join(a.address for a in cluster.children)}")
        if sink is not None:
            click.echo(
                f"  mail: caught by a local sink, shown at {me.url}admin/mail "
                f"and saved in {sink.folder} (JODL_SMTP_HOST sends real mail)"
            )
        for line in me.lines():  # last, so they are the lines a newcomer sees
            click.echo(line)
        click.echo("Press Ctrl-C to stop; `jodl up --print-login` shows this login again.")
        sys.stdout.flush()

        def stop_web_with_cluster() -> None:
            # The master failed (or the cluster was stopped): the web server stops too.
            cluster.stopping.wait()
            svc.stopping.set()

        threading.Thread(target=stop_web_with_cluster, name="jodl-up-link", daemon=True).start()
        serve(server, svc.stopping)
    except KeyboardInterrupt:
        pass  # stopped before the web server was serving
    finally:
        cluster.stop()
        if sink is not None:
            sink.stop()
        if started:
            click.echo("JODL stopped.")
    if cluster.failure:
        raise JodlError(cluster.failure)


def _start_mail_sink(app: Any, cluster: Any) -> Any:
    """Start the local mail sink and point the agents at it, unless JODL_SMTP_HOST is set."""
    if os.environ.get("JODL_SMTP_HOST"):
        return None
    from pathlib import Path

    from .mailsink import CONFIG_KEY, DEFAULT_FOLDER, MailSink

    sink = MailSink(Path(DEFAULT_FOLDER).resolve())
    sink.start()
    cluster.agent_env.update({"JODL_SMTP_HOST": "127.0.0.1", "JODL_SMTP_PORT": str(sink.port)})
    app.config[CONFIG_KEY] = str(sink.folder)
    return sink


def _refuse_second_master(cluster: Any, database: str) -> None:
    """One master per database: a second ``jodl up`` says what runs and stops."""
    from . import instance

    holder = cluster.store.running_master()
    if holder is None:
        return
    running = instance.read()
    where = f", web UI {running.url}" if running and running.alive() else ""
    raise JodlError(
        f"a master ({holder}{where}) is already running on {hide_password(database)}; "
        "stop it first, or give this one another JODL_DATABASE_URL"
    )


def _print_login() -> None:
    from . import instance

    found = instance.read()
    if found is None:
        raise JodlError("no jodl up has run in this folder")
    for line in found.lines():
        click.echo(line)
    if not found.alive():
        raise JodlError(f"that jodl up (process {found.pid}) is not running any more")


def _up_server(app: Any, settings: WebSettings, listen: str | None) -> Any:
    if listen:
        return make_server(app, settings, listen)
    try:
        return make_server(app, settings, settings.web_listen)
    except JodlError:
        return make_server(app, settings, "127.0.0.1:0")  # the default port is taken


# -- operators ------------------------------------------------------------------------------------


@click.group("admins")
def admins() -> None:
    """Grant or revoke the operator (admin) role of web UI users."""


def _sessions(ctx: click.Context) -> Any:
    from sqlalchemy.orm import sessionmaker

    return sessionmaker(store_of(ctx).engine, expire_on_commit=False)


@admins.command("add")
@click.argument("email")
@click.option("--password", is_flag=True, help="Ask for a password (new users need one).")
@click.pass_context
def admins_add(ctx: click.Context, email: str, password: bool) -> None:
    """Make EMAIL an operator (creating the user if needed)."""

    from crawler_app import add_user, normalise_email, set_password

    from . import queries

    secret = None
    if password:
        secret = click.prompt("password", hide_input=True, confirmation_prompt=True)
    with _sessions(ctx).begin() as s:
        user = queries.user_by_email(s, normalise_email(email))
        if user is None:
            if secret is None:
                raise JodlError(f"no user {email}; add --password to create one")
            user = add_user(s, email, secret)
        elif secret is not None:
            set_password(user, secret)
        user.is_admin = True
        click.echo(f"{user.email} is an operator")


@admins.command("remove")
@click.argument("email")
@click.pass_context
def admins_remove(ctx: click.Context, email: str) -> None:
    """Take the operator role from EMAIL."""

    from crawler_app import normalise_email

    from . import queries

    with _sessions(ctx).begin() as s:
        user = queries.user_by_email(s, normalise_email(email))
        if user is None:
            raise JodlError(f"no user {email}")
        user.is_admin = False
    click.echo(f"{email} is no longer an operator")


@admins.command("list")
@click.pass_context
def admins_list(ctx: click.Context) -> None:
    """List the operators."""
    from . import queries

    with _sessions(ctx)() as s:
        for user in queries.admins_by_email(s):
            click.echo(user.email)


def register(group: click.Group) -> None:
    """Add ``web``, ``up`` and ``admins`` to the ``jodl`` group (entry point ``jodl.commands``)."""
    for command in (web_cmd, up_cmd, admins):
        group.add_command(command)
