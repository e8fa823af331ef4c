"""What a running ``jodl up`` leaves for others to find: its URL, login and database.

``jodl up`` writes :data:`INSTANCE_FILE` in its working directory (readable by its
owner only) once everything serves, and removes
it when it stops. ``jodl up --print-login`` prints it again, so the login the
first lines showed is never lost in the log that follows.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

#: File in ``jodl up``'s working directory describing the running instance.
INSTANCE_FILE = ".jodl-up.json"


@dataclass(frozen=True)
class Instance:
    """A ``jodl up`` process: where its web UI is, its operator login, its database."""

    url: str
    email: str
    #: How to log in: the operator's e-mail and the file holding the password
    #: (:func:`web.trial.login_line`); the password itself is never printed.
    login: str
    database: str
    pid: int

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def lines(self) -> list[str]:
        """The lines ``jodl up`` prints last (and ``--print-login`` again)."""
        return [
            f"JODL is up: {self.url}",
            f"  operator login: {self.login}",
            f"  database: {self.database}",
        ]


def read(folder: Path | None = None) -> Instance | None:
    """The instance recorded in ``folder`` (default: here), or None."""
    path = (folder or Path.cwd()) / INSTANCE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Instance(**data)
    except (OSError, ValueError, TypeError):
        return None


def write(instance: Instance, folder: Path | None = None) -> None:
    """Record ``instance`` (owner-only permissions)."""
    path = (folder or Path.cwd()) / INSTANCE_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(asdict(instance), fh)


def remove(pid: int, folder: Path | None = None) -> None:
    """Remove the record if it is ``pid``'s (a newer instance's stays)."""
    found = read(folder)
    if found is not None and found.pid == pid:
        try:
            ((folder or Path.cwd()) / INSTANCE_FILE).unlink()
        except OSError:
            pass
