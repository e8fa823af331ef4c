"""The page checker's ``jodl`` commands: users, track, untrack, pause, resume, tracked,
check, cycle, channels, import, export.

Installed through the entry point group ``jodl.commands``: :func:`register`
receives the ``jodl`` click group and adds the commands to it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from jodl.cli.context import settings_of, store_of
from jodl.cli.progress import REPORTED_BY_COMMAND, progress_reporters
from jodl.exceptions import JodlError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: Loggers whose INFO lines ``jodl cycle`` reports itself (opened, summary).
QUIET = (*REPORTED_BY_COMMAND, "crawler_app.cycle")


def _engine(ctx: click.Context) -> Any:
    return store_of(ctx).engine


@contextmanager
def _session(ctx: click.Context) -> Iterator[Session]:
    """A session in one transaction; a missing table becomes one clear line."""
    from sqlalchemy.exc import OperationalError, ProgrammingError
    from sqlalchemy.orm import sessionmaker

    sessions = sessionmaker(_engine(ctx), expire_on_commit=False)
    try:
        with sessions() as s, s.begin():
            yield s
    except (OperationalError, ProgrammingError) as exc:
        if "no such table" in str(exc) or "does not exist" in str(exc):
            raise JodlError(
                "the database has no page checker tables; run: jodl db upgrade"
            ) from None
        raise


# -- users ----------------------------------------------------------------------------------


@click.group()
def users() -> None:
    """Add, list and remove users of the page checker."""


@users.command("add")
@click.argument("email")
@click.option(
    "--with-password", is_flag=True, help="Ask for a password (for the web UI), twice, hidden."
)
@click.pass_context
def users_add(ctx: click.Context, email: str, with_password: bool) -> None:
    """Add the user EMAIL."""
    from .users.pages import add_user

    password = None
    if with_password:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    with _session(ctx) as s:
        user = add_user(s, email, password)
        click.echo(f"user {user.id} {user.email} added")


@users.command("list")
@click.pass_context
def users_list(ctx: click.Context) -> None:
    """List users with how many pages each tracks."""
    from .users.pages import users_with_counts

    with _session(ctx) as s:
        rows = users_with_counts(s)
    for user_id, email, count in rows:
        click.echo(f"{user_id:5d} {email:40s} {count} tracked")


@users.command("remove")
@click.argument("email")
@click.pass_context
def users_remove(ctx: click.Context, email: str) -> None:
    """Remove the user EMAIL and their trackings."""
    from .users.pages import remove_user

    with _session(ctx) as s:
        remove_user(s, email)
    click.echo(f"user {email} removed")


# -- tracking ---------------------------------------------------------------------------------


def view_options(command: Any) -> Any:
    """The options that say which view of a page a tracking is (crawler_app.fetching.filters)."""
    options = [
        click.option(
            "--selector",
            default=None,
            help="Track only the part this picks: a CSS selector, or XPath (starts with / "
            "or '(', or xpath:...), or JSONPath (starts with $, or jsonpath:...).",
        ),
        click.option("--xpath", default=None, help="XPath expression: track only what it picks."),
        click.option(
            "--jsonpath", default=None, help="JSONPath expression (JSON documents): the same."
        ),
        click.option(
            "--include",
            multiple=True,
            help="Regular expression: keep only lines matching it (repeatable).",
        ),
        click.option(
            "--exclude", multiple=True, help="Regular expression: drop lines matching it."
        ),
        click.option(
            "--ignore",
            multiple=True,
            help="Text: drop lines containing it, in any case (re:REGEX for a regular "
            "expression), before comparing.",
        ),
        click.option(
            "--trigger",
            default=None,
            help="Alert only when the filtered text contains this (any case; re:REGEX: "
            "matches it).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def view_of(
    selector: str | None,
    xpath: str | None,
    jsonpath: str | None,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    ignore: tuple[str, ...],
    trigger: str | None,
) -> Any:
    """The :class:`~crawler_app.fetching.filters.ViewSpec` the view options give; a bad expression
    is refused naming it."""
    from .users.pages import PageError, check_view

    # An explicit option names the kind, whatever the expression starts with.
    given = [
        value if kind == "css" else f"{kind}:{value}"
        for kind, value in (("css", selector), ("xpath", xpath), ("jsonpath", jsonpath))
        if value
    ]
    if len(given) > 1:
        raise PageError("give one of --selector, --xpath, --jsonpath")
    return check_view(
        selector=given[0] if given else None,
        include=list(include),
        exclude=list(exclude),
        ignore=list(ignore),
        trigger=trigger,
    )


@click.command()
@click.argument("url")
@click.option("--user", "email", required=True, help="E-mail of the user who tracks it.")
@view_options
@click.option(
    "--period",
    type=click.IntRange(min=1),
    default=None,
    help="Check the page every N-th cycle (default 1).",
)
@click.option(
    "--browser/--no-browser",
    default=None,
    help="Render the page in a browser (Chromium) first: for pages that build their text "
    "with JavaScript.",
)
@click.option(
    "--tag",
    "tags",
    multiple=True,
    help="A label for this tracking (repeat for several; given tags replace the old ones).",
)
@click.option(
    "--every",
    default=None,
    help="Check the page this often: 90s, 15m, 2h, 1d, 1w (within JODL_CHECK_EVERY_MIN/_MAX).",
)
@click.option(
    "--cron",
    default=None,
    help="Check the page on this cron expression (MIN HOUR DAY MONTH WEEKDAY, local time).",
)
@click.option(
    "--default-schedule",
    is_flag=True,
    help="Forget the tracking's --every/--cron: check on the operator's JODL_SCHEDULE.",
)
@click.pass_context
def track(
    ctx: click.Context,
    url: str,
    email: str,
    period: int | None,
    browser: bool | None,
    tags: tuple[str, ...],
    every: str | None,
    cron: str | None,
    default_schedule: bool,
    **filters: Any,
) -> None:
    """USER tracks URL: they get a digest when it changes.

    The filters make a view of the page; the same user may track a page through
    several views (each compared and alerted on its own; the page is still fetched
    once per due time). The page's first check is queued at once: it takes the
    baseline that later checks compare with (a running master serves it).

    --every or --cron set when this tracking wants the page checked (tracking it
    again through the same view changes them); the page is checked at the
    shortest schedule among its trackers', still once per due time."""
    from jodl.queue import Queue

    from .checking import baselines
    from .checking.due import Schedule, check_schedule_of
    from .fetching.filters import describe_key
    from .models import Page
    from .users.pages import track as do_track
    from .users.pages import trackers_count

    if default_schedule and (every or cron):
        raise JodlError("--default-schedule goes without --every and --cron")
    schedule = Schedule() if default_schedule else None
    if every is not None or cron is not None:
        schedule = check_schedule_of(every, cron)
    view = view_of(**filters)
    with _session(ctx) as s:
        tracking = do_track(
            s,
            email,
            url,
            period=period,
            browser=browser,
            view=view,
            tags=tags or None,
            schedule=schedule,
        )
        page = s.get(Page, tracking.page_id)
        assert page is not None
        trackers = trackers_count(s, page.id)
    baselines.request(Queue(_engine(ctx)), _engine(ctx), [page.id])
    key = tracking.selector or ""
    part = f" ({describe_key(key)})" if view.filters_lines or view.trigger else ""
    part = f" (selector {key})" if key and not part else part
    part += " in a browser" if page.browser else ""
    part += f" tagged {', '.join(tracking.tags)}" if tracking.tags else ""
    when = Schedule(tracking.every, tracking.cron).describe()
    click.echo(
        f"{email} tracks {page.url}{part}, {when}; {trackers} tracker(s), one fetch per due time"
    )


@click.command()
@click.argument("url")
@click.option("--user", "email", required=True, help="E-mail of the user.")
@view_options
@click.pass_context
def untrack(ctx: click.Context, url: str, email: str, **filters: Any) -> None:
    """USER stops tracking URL: through the view the filters give, if any; else
    through all their views of it."""
    from jodl.queue import Queue

    from .checking import baselines
    from .users.pages import normalise_url, page_ids
    from .users.pages import untrack as do_untrack

    only = any(filters.values())
    view = view_of(**filters) if only else None
    with _session(ctx) as s:
        if not do_untrack(s, email, url, view=view):
            part = " through that view" if only else ""
            raise JodlError(f"{email} does not track {url}{part}")
        ids = page_ids(s, [normalise_url(url)])
    # The last tracker who wanted the browser gone: the others' new baseline at once.
    baselines.request(Queue(_engine(ctx)), _engine(ctx), ids)
    click.echo(f"{email} no longer tracks {url}")


def _pause(ctx: click.Context, url: str, email: str, paused: bool) -> None:
    from jodl.queue import Queue

    from .checking import baselines
    from .users.pages import normalise_url, page_ids, set_paused

    with _session(ctx) as s:
        changed = set_paused(s, email, url, paused)
        ids = page_ids(s, [normalise_url(url)])
    if not paused:
        # Views that never got a baseline take one now, as a new tracking's do.
        baselines.request(Queue(_engine(ctx)), _engine(ctx), ids)
    word = "paused" if paused else "resumed"
    click.echo(f"{email}: {changed} tracking(s) of {url} {word}")


@click.command()
@click.argument("url")
@click.option("--user", "email", required=True, help="E-mail of the user.")
@click.pass_context
def pause(ctx: click.Context, url: str, email: str) -> None:
    """Pause USER's trackings of URL: their history stays, no digests come, and a
    page whose trackings are all paused is not fetched."""
    _pause(ctx, url, email, True)


@click.command()
@click.argument("url")
@click.option("--user", "email", required=True, help="E-mail of the user.")
@click.pass_context
def resume(ctx: click.Context, url: str, email: str) -> None:
    """Resume USER's paused trackings of URL: the page is checked again."""
    _pause(ctx, url, email, False)


@click.command()
@click.option("--user", "email", default=None, help="Only this user's trackings.")
@click.pass_context
def tracked(ctx: click.Context, email: str | None) -> None:
    """List tracked pages with their last check (and each view's filters and problem)."""
    from .checking.due import Schedule
    from .fetching.filters import describe_key
    from .users import pages

    with _session(ctx) as s:
        rows = pages.tracked_rows(s, email)
    for address, page, selector, problem, paused, tags, every, cron in rows:
        checked = (
            page.last_checked_at.isoformat(timespec="seconds") if page.last_checked_at else "never"
        )
        state = page.last_error or (f"HTTP {page.last_status}" if page.last_status else "-")
        part = f" [{describe_key(selector)}]" if selector else ""
        note = f"  ({pages.page_note(page)})" if pages.page_note(page) else ""
        note += f"  (filter: {problem})" if problem else ""
        note += "  (paused)" if paused else ""
        note += f"  {Schedule(every, cron).describe()}" if every or cron else ""
        note += f"  tags: {', '.join(tags)}" if tags else ""
        click.echo(f"{page.url}{part}  {address}  checked={checked}  {state}{note}")


# -- checking ----------------------------------------------------------------------------------


@click.command()
@click.argument("urls", nargs=-1, required=True)
@click.option(
    "--selector", default=None, help="CSS selector, XPath or JSONPath applied to every page."
)
@click.option("--text", "show_text", is_flag=True, help="Print the normalised text too.")
@click.option("--json", "as_json", is_flag=True, help="One JSON result per line.")
def check(urls: tuple[str, ...], selector: str | None, show_text: bool, as_json: bool) -> None:
    """Fetch URL... now, in this process, and print what a check sees (nothing is stored).

    The same fetch path as the agents: SSRF guard, limits, robots.txt, politeness
    (JODL_FETCH_* settings).
    """
    import asyncio

    from .fetching.fetcher import Fetcher
    from .settings import AppSettings
    from .users.pages import check_selector, normalise_url

    settings = AppSettings.from_env()
    selector = check_selector(selector)
    normal = [normalise_url(url) for url in urls]

    async def fetch_all() -> list[dict[str, Any]]:
        async with Fetcher(settings.fetch_settings()) as fetcher:
            return await asyncio.gather(*(fetcher.fetch(u, selector=selector) for u in normal))

    failed = 0
    for result in asyncio.run(fetch_all()):
        failed += not result["ok"]
        if as_json:
            click.echo(json.dumps(result, default=str))
            continue
        if result["ok"]:
            title = f" {result['title']!r}" if result.get("title") else ""
            click.echo(
                f"{result['url']}: HTTP {result['status']}, {result['size']} bytes, "
                f"{len(result['text'] or '')} chars, fingerprint {result['fingerprint'][:16]}"
                f"{title} ({result['elapsed']:.2f}s)"
            )
            if show_text:
                click.echo(result["text"] or "")
        else:
            click.echo(f"{result['url']}: {result['error']}: {result['error_message']}")
    if failed:
        sys.exit(1)


@click.command()
@click.option(
    "--takeover",
    is_flag=True,
    help="Run it here, taking the master lease from a running master (which then stops).",
)
@click.pass_context
def cycle(ctx: click.Context, takeover: bool) -> None:
    """Run one application cycle now (resuming an unfinished one) with a progress bar.

    Checks every tracked page, due or not, on the registered agents, records
    changes, e-mails digests. Beside a running master (`jodl master`, `jodl up`) the
    cycle is asked of that master, as the web UI's "start a cycle now" does, and
    followed here: it checks the pages due (docs/schedules.md).
    """
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from jodl.master import Master

    from .checking.cycle import PageCycle
    from .settings import AppSettings

    app = AppSettings.from_env()
    store = store_of(ctx)
    holder = None if takeover else store.running_master()
    if holder is not None:
        result = _cycle_by(holder, store)
        click.echo(result.line())
        return
    if not store.nodes():
        raise JodlError(
            "no agent nodes: start one with `jodl agent` and add it with `jodl node add HOST:PORT`"
        )
    with progress_reporters("cycle", quiet=QUIET) as (on_step, progress):
        master = Master(settings_of(ctx), store=store, progress=progress, takeover=takeover)
        try:
            runner = PageCycle(master.store.engine, master.run_cycle, app, on_step=on_step)
            try:
                result = runner.run(trigger="command")
            except (OperationalError, ProgrammingError) as exc:
                if "no such table" in str(exc) or "does not exist" in str(exc):
                    raise JodlError(
                        "the database has no page checker tables; run: jodl db upgrade"
                    ) from None
                raise
        finally:
            master.close()
    click.echo(result.line())


def _cycle_by(holder: str, store: Any) -> Any:
    """Ask the running master ``holder`` for a cycle now and follow it to its end."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from .checking import cycle_requests

    try:
        request_id = cycle_requests.request_cycle(store.engine, None)
    except (OperationalError, ProgrammingError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise JodlError(f"cannot ask the running master for a cycle ({first})") from None
    click.echo(f"a master ({holder}) runs this database: the cycle is asked of it", err=True)
    with progress_reporters("waiting for the master") as (on_step, progress):
        return cycle_requests.follow(
            store.engine,
            request_id,
            master_alive=lambda: store.running_master() is not None,
            on_step=on_step,
            progress=progress,
        )


def register(group: click.Group) -> None:
    """Add the page checker's commands to the ``jodl`` group (entry point ``jodl.commands``)."""
    from .channel_commands import channels
    from .porting_commands import export, import_
    from .quota_commands import quota as quota_command

    users.add_command(quota_command)

    for command in (users, track, untrack, pause, resume, tracked, check, cycle, channels):
        group.add_command(command)
    group.add_command(import_)
    group.add_command(export)
