"""A local mail sink for ``jodl up``: digests land in a folder and on an operator page.

``jodl up`` starts :class:`MailSink`, an aiosmtpd SMTP server on a free loopback
port, and points its agents' ``JODL_SMTP_HOST``/``JODL_SMTP_PORT`` at it (unless
``JODL_SMTP_HOST`` is set: then real mail goes to that server). Every message
received is written as an ``.eml`` file to the sink's folder, and the operator
page ``/admin/mail`` lists them, newest first, so the digest the product exists to
send can be seen on one machine without a mail server.
"""

from __future__ import annotations

import email
import email.policy
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Blueprint, current_app, render_template

from .auth import admin_required

bp = Blueprint("mailsink", __name__, url_prefix="/admin")

#: Folder (in ``jodl up``'s working directory) the sink writes its ``.eml`` files to.
DEFAULT_FOLDER = "jodl-mail"
#: Key of the app's config naming the sink's folder (None: no sink in this process).
CONFIG_KEY = "JODL_MAIL_SINK"
#: Messages listed on the page at most (the newest).
LISTED = 50


class _Handler:
    """aiosmtpd handler: every accepted message becomes one ``.eml`` file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._numbers = itertools.count(1)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        name = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{next(self._numbers):05d}.eml"
        tmp = self.folder / (name + ".part")
        tmp.write_bytes(envelope.original_content or envelope.content)
        tmp.rename(self.folder / name)  # whole files only: the page never reads half of one
        return "250 OK"


class MailSink:
    """An SMTP server on 127.0.0.1 writing what it receives to ``folder``."""

    def __init__(self, folder: Path) -> None:
        from aiosmtpd.controller import Controller

        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._make = lambda port: Controller(_Handler(folder), hostname="127.0.0.1", port=port)
        self._controller: Any = None

    def start(self) -> None:
        """Listen on a free port (aiosmtpd needs the number before it binds: a port taken
        in between is retried with another)."""
        from .cluster import free_port

        for attempt in range(5):
            self._controller = self._make(free_port())
            try:
                self._controller.start()
                return
            except (OSError, RuntimeError):
                if attempt == 4:
                    raise

    @property
    def port(self) -> int:
        return int(self._controller.port)

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None


@dataclass(frozen=True)
class Message:
    """One received message, as the page shows it."""

    file: str
    sender: str
    to: str
    subject: str
    date: str
    text: str


def messages(folder: Path, limit: int = LISTED) -> list[Message]:
    """The newest ``limit`` messages in ``folder``, newest first."""
    files = sorted(folder.glob("*.eml"), reverse=True)[:limit]
    out = []
    for path in files:
        try:
            msg = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
        except OSError:
            continue
        body = msg.get_body(preferencelist=("plain", "html"))
        text = body.get_content() if body is not None else ""
        out.append(
            Message(
                path.name,
                str(msg.get("From", "")),
                str(msg.get("To", "")),
                str(msg.get("Subject", "")),
                str(msg.get("Date", "")),
                text,
            )
        )
    return out


@bp.route("/mail")
@admin_required
def mail() -> Any:
    folder = current_app.config.get(CONFIG_KEY)
    found = messages(Path(folder)) if folder else []
    return render_template("mail.html", folder=folder, messages=found)
