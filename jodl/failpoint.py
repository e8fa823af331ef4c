"""Named crash points for crash tests (like failpoints in databases).

``JODL_FAILPOINT=NAME:N`` makes the process SIGKILL itself the N-th time it
reaches ``hit("NAME")``. Unset (the default), ``hit`` costs one dict lookup.
Points in the master: ``before_send`` (nothing logged or sent), ``after_log``
(executions logged, nothing sent),
``after_send`` (sent, nothing collected), ``before_commit`` (results collected
from agents, not yet committed), ``after_commit`` (committed, not acknowledged).
"""

from __future__ import annotations

import os
import signal

_spec = os.environ.get("JODL_FAILPOINT", "")
_name, _, _count = _spec.partition(":")
_left = int(_count or 1) if _name else 0


def hit(name: str) -> None:
    """Die at once (SIGKILL, no cleanup) if ``name`` is the armed point and its turn came."""
    global _left
    if name != _name or _left <= 0:
        return
    _left -= 1
    if _left == 0:
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["hit"]
