"""A local mail sink for ``jodl up``: digests land in a folder and on an operator page.

``jodl up`` starts :class:`MailSink`, an aiosmtpd SMTP server on a free loopback
port, and points its agents' ``JODL_SMTP_HOST``/``JODL_SMTP_PORT`` at it (unless
``JODL_SMTP_HOST`` is set: then real mail goes to that server). Every message
received is written as an ``.eml`` file to the sink's folder, and the operator
page ``/admin/mail`` lists them, newest first, so the digest the product exists to
send can be seen on one machine without a mail server. The folder and its files are
its owner's only (sign-up links are in them); their size is bounded
(:data:`MAX_MESSAGE` each, :data:`MAX_TOTAL` together).
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
#: Largest message accepted (bytes; larger ones are refused in SMTP): a digest is a
#: few KiB, so this leaves room for a long one and nothing for a flood.
MAX_MESSAGE = 1024 * 1024
#: Most bytes the folder's messages take together: the oldest are deleted beyond it.
MAX_TOTAL = 32 * 1024 * 1024
#: Bytes of each message the page reads (headers and the start of the text).
PREVIEW_BYTES = 64 * 1024


class _Handler:
    """aiosmtpd handler: every accepted message becomes one ``.eml`` file, readable by
    its owner only (sign-up links are in them), the oldest deleted beyond ``max_total``."""

    def __init__(self, folder: Path, max_total: int) -> None:
        self.folder = folder
        self.max_total = max_total
        self._numbers = itertools.count(1)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        name = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{next(self._numbers):05d}.eml"
        tmp = self.folder / (name + ".part")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(envelope.original_content or envelope.content)
        tmp.rename(self.folder / name)  # whole files only: the page never reads half of one
        self._prune()
        return "250 OK"

    def _prune(self) -> None:
        """Delete the oldest messages while all of them take more than ``max_total``."""
        sizes = []
        for path in sorted(self.folder.glob("*.eml")):  # names start with the time
            try:
                sizes.append((path, path.stat().st_size))
            except OSError:
                continue
        total = sum(size for _, size in sizes)
        for path, size in sizes:
            if total <= self.max_total:
                return
            path.unlink(missing_ok=True)
            total -= size


class MailSink:
    """An SMTP server on 127.0.0.1 writing what it receives to ``folder`` (owner only)."""

    def __init__(
        self, folder: Path, max_message: int = MAX_MESSAGE, max_total: int = MAX_TOTAL
    ) -> None:
        from aiosmtpd.controller import Controller

        self.folder = folder
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)  # also a folder an older version left open to others
        handler = _Handler(folder, max_total)
        self._make = lambda port: Controller(
            handler, hostname="127.0.0.1", port=port, data_size_limit=max_message
        )
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
    """The newest ``limit`` messages in ``folder``, newest first, each read only up to
    :data:`PREVIEW_BYTES` (a longer text is shown cut, with a note)."""
    files = sorted(folder.glob("*.eml"), reverse=True)[:limit]
    out = []
    for path in files:
        try:
            with path.open("rb") as fh:
                head = fh.read(PREVIEW_BYTES + 1)
        except OSError:
            continue
        cut = len(head) > PREVIEW_BYTES
        msg = email.message_from_bytes(head[:PREVIEW_BYTES], policy=email.policy.default)
        try:
            body = msg.get_body(preferencelist=("plain", "html"))
            text = body.get_content() if body is not None else ""
        except (LookupError, ValueError):  # a part cut off in the middle of its encoding
            text = ""
        if cut:
            text += f"\n[... the rest is in {path.name}]"
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
