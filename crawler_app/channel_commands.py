"""``jodl channels add|list|remove|test``: a user's notification channels
(:mod:`crawler_app.notify.channels`). Refusals are one line and a non-zero exit."""

from __future__ import annotations

import click


def _allow() -> tuple[str, ...]:
    from .settings import AppSettings

    return tuple(AppSettings.from_env().channel_allow)


@click.group()
def channels() -> None:
    """Notification channels (Apprise URLs) that get each digest besides the e-mail."""


@channels.command("add")
@click.argument("email")
@click.argument("url")
@click.pass_context
def channels_add(ctx: click.Context, email: str, url: str) -> None:
    """Add the channel URL (an Apprise URL: ntfy://topic, json://host/path, mailto://...)
    for user EMAIL. A private address is refused unless JODL_CHANNEL_ALLOW allows it."""
    from .commands import _session
    from .notify.channels import add_channel
    from .users.pages import get_user

    with _session(ctx) as s:
        added = add_channel(s, get_user(s, email), url, _allow())
    click.echo(f"channel {added.id} {added.shown} added for {email}")


@channels.command("list")
@click.argument("email")
@click.pass_context
def channels_list(ctx: click.Context, email: str) -> None:
    """List the channels of user EMAIL (secrets masked)."""
    from .commands import _session
    from .notify.channels import list_channels
    from .users.pages import get_user

    with _session(ctx) as s:
        found = list_channels(s, get_user(s, email).id)
    for channel in found:
        click.echo(f"{channel.id}\t{channel.shown}")
    if not found:
        click.echo(f"{email} has no channel", err=True)


@channels.command("remove")
@click.argument("email")
@click.argument("channel_id", type=int)
@click.pass_context
def channels_remove(ctx: click.Context, email: str, channel_id: int) -> None:
    """Remove channel CHANNEL_ID of user EMAIL."""
    from .commands import _session
    from .notify.channels import remove_channel
    from .users.pages import get_user

    with _session(ctx) as s:
        shown = remove_channel(s, get_user(s, email).id, channel_id)
    click.echo(f"channel {channel_id} {shown} removed")


@channels.command("test")
@click.argument("email")
@click.argument("channel_id", type=int)
@click.pass_context
def channels_test(ctx: click.Context, email: str, channel_id: int) -> None:
    """Send a test message to channel CHANNEL_ID of user EMAIL now, from this machine."""
    from .commands import _session
    from .notify.channels import channel_of, send_test
    from .users.pages import get_user

    with _session(ctx) as s:
        url = channel_of(s, get_user(s, email).id, channel_id).url
    click.echo(f"test sent to {send_test(url, _allow())}")


__all__ = ["channels"]
