"""Atom feeds at secret-token URLs (:mod:`crawler_app.feeds`): no login, the token is
the key. A wrong or rotated token answers 404, as for a URL that never existed.

``/feeds/<user>/<token>/changes.atom`` lists the user's detected changes;
``/feeds/<user>/<token>/tags/<tag>.atom``, under the same token, only those of the
trackings tagged ``tag`` (rotating the token ends both).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, url_for
from werkzeug.exceptions import NotFound

from crawler_app import PageError, check_tags, feeds
from jodl.log import utcnow

from .services import services

bp = Blueprint("feeds", __name__, url_prefix="/feeds")

#: Longest token looked at (tokens are 43 characters).
MAX_TOKEN = 100


@bp.route("/<id:user_id>/<token>/changes.atom")
def changes(user_id: int, token: str) -> Any:
    return _feed(user_id, token, None)


@bp.route("/<id:user_id>/<token>/tags/<tag>.atom")
def tag_changes(user_id: int, token: str, tag: str) -> Any:
    try:
        (label,) = check_tags([tag])
    except (PageError, ValueError):
        raise NotFound("no such feed") from None
    return _feed(user_id, token, label)


def _feed(user_id: int, token: str, tag: str | None) -> Any:
    if len(token) > MAX_TOKEN:
        raise NotFound("no such feed")
    svc = services()
    with svc.batches.sessions() as s:
        user = feeds.user_by_token(s, user_id, token)
        if user is None:
            raise NotFound("no such feed")
        entries = feeds.changes(s, user.id, tag=tag)
    home = url_for("tracking.pages", _external=True)
    if tag is None:
        self_url = url_for("feeds.changes", user_id=user_id, token=token, _external=True)
        feed_id, title = f"{home}#changes-{user_id}", "JODL: changes of your tracked pages"
    else:
        self_url = url_for(
            "feeds.tag_changes", user_id=user_id, token=token, tag=tag, _external=True
        )
        feed_id = f"{home}#changes-{user_id}-tag-{tag}"
        title = f"JODL: changes of your pages tagged {tag}"
    body = feeds.atom(
        entries,
        feed_id=feed_id,
        title=title,
        self_url=self_url,
        home_url=home,
        diff_url=lambda e: url_for(
            "tracking.page", page_id=e.page_id, a=e.previous_id, b=e.snapshot_id, _external=True
        ),
        updated=utcnow(),
    )
    response = Response(body, mimetype="application/atom+xml")
    # The URL is a secret: not kept by shared caches, not sent on as a referrer.
    response.headers["Cache-Control"] = "private, max-age=300"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response
