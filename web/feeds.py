"""Atom feeds at secret-token URLs (:mod:`crawler_app.feeds`): no login, the token is
the key. A wrong or rotated token answers 404, as for a URL that never existed.

``/feeds/<user>/<token>/changes.atom`` lists the user's detected changes; a feed per
tag would sit beside it (``/feeds/<user>/<token>/tags/<tag>.atom``) and narrow
:func:`crawler_app.feeds.changes`.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, url_for
from werkzeug.exceptions import NotFound

from crawler_app import feeds
from jodl.log import utcnow

from .app import services

bp = Blueprint("feeds", __name__, url_prefix="/feeds")

#: Longest token looked at (tokens are 43 characters).
MAX_TOKEN = 100


@bp.route("/<id:user_id>/<token>/changes.atom")
def changes(user_id: int, token: str) -> Any:
    if len(token) > MAX_TOKEN:
        raise NotFound("no such feed")
    svc = services()
    with svc.batches.sessions() as s:
        user = feeds.user_by_token(s, user_id, token)
        if user is None:
            raise NotFound("no such feed")
        entries = feeds.changes(s, user.id)
    home = url_for("tracking.pages", _external=True)
    body = feeds.atom(
        entries,
        feed_id=f"{home}#changes-{user_id}",
        title="JODL: changes of your tracked pages",
        self_url=url_for("feeds.changes", user_id=user_id, token=token, _external=True),
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
