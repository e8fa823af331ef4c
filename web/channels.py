"""The user's notifications: channels (Apprise URLs), recent digests, the feed's URL.

The functions here are shared by the HTML views and the JSON API; they use the page
checker's channel operations (:mod:`crawler_app.channels`) so the web UI and
``jodl channels`` behave the same. Channel URLs are shown masked, never in full.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from werkzeug.exceptions import BadRequest, NotFound

from crawler_app import AppSettings, Delivery, channels, feeds
from jodl.exceptions import ConfigError

from . import queries
from .auth import CurrentUser, current_user, limit, login_required
from .services import Services, services
from .timefmt import iso

bp = Blueprint("channels", __name__)

#: Digests listed on the notifications page (newest first).
RECENT_DIGESTS = 20


def _allow() -> tuple[str, ...]:
    """The operator's allowlist for channels (JODL_CHANNEL_ALLOW) of this process."""
    try:
        return tuple(AppSettings.from_env().channel_allow)
    except ConfigError:
        return ()  # settings the master refuses too: nothing private admitted


def list_channels(svc: Services, user: CurrentUser) -> list[dict[str, Any]]:
    with svc.batches.sessions() as s:
        return [{"id": c.id, "url": c.shown} for c in channels.list_channels(s, user.id)]


def add_channel(svc: Services, user: CurrentUser, url: Any) -> dict[str, Any]:
    """Add a channel; :class:`BadRequest` saying why not (a refused address, a URL
    Apprise does not know, a duplicate)."""
    if not isinstance(url, str) or not url.strip():
        raise BadRequest("url: an Apprise URL such as ntfy://my-topic or json://host/hook")
    try:
        with svc.batches.sessions.begin() as s:
            row = queries.user_by_id(s, user.id)
            assert row is not None
            added = channels.add_channel(s, row, url, _allow())
    except channels.ChannelError as exc:
        raise BadRequest(str(exc)) from None
    return {"id": added.id, "url": added.shown}


def remove_channel(svc: Services, user: CurrentUser, channel_id: int) -> str:
    try:
        with svc.batches.sessions.begin() as s:
            return channels.remove_channel(s, user.id, channel_id)
    except channels.ChannelError:
        raise NotFound("you have no such channel") from None


def test_channel(svc: Services, user: CurrentUser, channel_id: int) -> dict[str, Any]:
    """Send a test message to one of the user's channels now; ``ok`` and what happened."""
    limit("submit")
    with svc.batches.sessions() as s:
        try:
            url = channels.channel_of(s, user.id, channel_id).url
        except channels.ChannelError:
            raise NotFound("you have no such channel") from None
    try:
        shown = channels.send_test(url, _allow())
    except channels.ChannelError as exc:
        return {"ok": False, "message": str(exc)}
    return {"ok": True, "message": f"test sent to {shown}"}


def recent_digests(svc: Services, user: CurrentUser) -> list[dict[str, Any]]:
    """The user's latest digests: the e-mail's state and each channel delivery's."""
    with svc.batches.sessions() as s:
        notes = queries.recent_notifications(s, user.id, RECENT_DIGESTS)
        deliveries: dict[int, list[Delivery]] = {}
        for d in queries.deliveries_of(s, [n.id for n in notes]):
            deliveries.setdefault(d.notification_id, []).append(d)
        return [
            {
                "cycle": n.cycle_id,
                "created_at": iso(n.created_at),
                "changes": len(n.snapshots or ()),
                "email": {"state": n.state, "error": n.error, "sent_at": iso(n.sent_at)},
                "channels": [
                    {
                        "channel": d.channel_id,
                        "state": d.state,
                        "error": d.error,
                        "sent_at": iso(d.sent_at),
                    }
                    for d in deliveries.get(n.id, [])
                ],
            }
            for n in notes
        ]


def last_failure(svc: Services, user: CurrentUser) -> str | None:
    """Why the user's latest digest failed to reach them somewhere (None: it did not)."""
    latest = recent_digests(svc, user)[:1]
    for digest in latest:
        if digest["email"]["state"] == "failed":
            return f"e-mail: {digest['email']['error']}"
        for d in digest["channels"]:
            if d["state"] == "failed":
                return str(d["error"])
    return None


def _feed_token(svc: Services, user: CurrentUser, rotate: bool = False) -> str:
    with svc.batches.sessions.begin() as s:
        row = queries.user_by_id(s, user.id)
        assert row is not None
        return feeds.rotate_token(s, row) if rotate else feeds.feed_token(s, row)


def feed_url(svc: Services, user: CurrentUser, rotate: bool = False) -> str:
    """The URL of the user's Atom feed (a token made now if none; a new one with ``rotate``)."""
    token = _feed_token(svc, user, rotate)
    return url_for("feeds.changes", user_id=user.id, token=token, _external=True)


def feed_urls(svc: Services, user: CurrentUser, rotate: bool = False) -> dict[str, Any]:
    """The URL of the user's feed and of the feed of each tag they use (``tags``)."""
    url = feed_url(svc, user, rotate)
    with svc.batches.sessions() as s:
        tags = queries.tags_of_trackings(s, user.id)
    return {"url": url, "tags": tag_feed_urls(svc, user, tags)}


def tag_feed_urls(svc: Services, user: CurrentUser, tags: Iterable[str]) -> dict[str, str]:
    """The URL of the Atom feed of each tag (the same token as :func:`feed_url`'s)."""
    wanted = sorted(set(tags))
    if not wanted:
        return {}
    token = _feed_token(svc, user)
    return {
        tag: url_for("feeds.tag_changes", user_id=user.id, token=token, tag=tag, _external=True)
        for tag in wanted
    }


# -- views ------------------------------------------------------------------------------------


def _user() -> CurrentUser:
    user = current_user()
    assert user is not None  # login_required
    return user


def _page(code: int = 200, url: str = "") -> Any:
    svc = services()
    user = _user()
    return (
        render_template(
            "notifications.html",
            channels=list_channels(svc, user),
            digests=recent_digests(svc, user),
            feed=feed_url(svc, user),
            url=url,
        ),
        code,
    )


@bp.route("/notifications")
@login_required
def notifications() -> Any:
    return _page()


@bp.route("/notifications/channels", methods=["POST"])
@login_required
def channels_add() -> Any:
    url = request.form.get("url", "")
    try:
        added = add_channel(services(), _user(), url)
    except BadRequest as exc:
        flash(str(exc.description), "error")
        return _page(400, url[:2100])
    flash(f"Channel {added['url']} added.", "ok")
    return redirect(url_for("channels.notifications"), 303)


@bp.route("/notifications/channels/<id:channel_id>/remove", methods=["POST"])
@login_required
def channels_remove(channel_id: int) -> Any:
    shown = remove_channel(services(), _user(), channel_id)
    flash(f"Channel {shown} removed.", "ok")
    return redirect(url_for("channels.notifications"), 303)


@bp.route("/notifications/channels/<id:channel_id>/test", methods=["POST"])
@login_required
def channels_test(channel_id: int) -> Any:
    outcome = test_channel(services(), _user(), channel_id)
    flash(outcome["message"], "ok" if outcome["ok"] else "error")
    return redirect(url_for("channels.notifications"), 303)


@bp.route("/notifications/feed/rotate", methods=["POST"])
@login_required
def feed_rotate() -> Any:
    feed_url(services(), _user(), rotate=True)
    flash("The feed has a new address; the old one no longer works.", "ok")
    return redirect(url_for("channels.notifications"), 303)
