"""What ``jodl up`` does to stay safe as a one-command trial.

* The operator's password goes to a file only its owner can read
  (:data:`LOGIN_FILE`, mode 0600), never to the terminal, where scroll-back and
  logs keep it.
* Listening on an address other machines reach is allowed, with a warning: the
  trial's agents fetch for anyone its web UI lets in.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

#: File (in the working directory) that receives the operator login of ``jodl up``.
LOGIN_FILE = "jodl-up-login.txt"


def write_login(email: str, password: str, path: str | Path = LOGIN_FILE) -> Path:
    """Write the operator login to ``path``, readable by its owner only (0600)."""
    target = Path(path).resolve()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file of another mode is narrowed too
        os.write(fd, f"{email}\n{password}\n".encode())
    finally:
        os.close(fd)
    return target


def read_login(path: str | Path = LOGIN_FILE) -> tuple[str, str] | None:
    """The (e-mail, password) an earlier ``jodl up`` here wrote, so a restart keeps it."""
    try:
        email, password = Path(path).read_text(encoding="utf-8").split()
    except (OSError, ValueError):
        return None
    return email, password


def login_line(email: str, password: str | None) -> str:
    """The line ``jodl up`` prints about the operator login (never the password)."""
    if not password:
        return f"{email} (password unchanged)"
    return f"{email}, password in {write_login(email, password)} (readable only by you)"


def public_warning(host: str) -> str | None:
    """A warning when ``host`` (the address ``jodl up`` listens on) is not loopback."""
    name = host.strip("[]")
    try:
        loopback = ipaddress.ip_address(name).is_loopback
    except ValueError:
        loopback = name == "localhost"
    if loopback:
        return None
    return (
        f"warning: listening on {name}, which other machines may reach; this is a trial "
        "setup (anyone reaching it can submit URLs for the agents to fetch). Put it "
        "behind a TLS proxy and set JODL_WEB_ANONYMOUS_SUBMIT=false for real use"
    )
