"""Named crash points for crash tests (like failpoints in databases).

``JODL_FAILPOINT=NAME:N`` makes the process SIGKILL itself the N-th time it
reaches ``hit("NAME")``. Unset (the default), ``hit`` costs one dict lookup.
Points in the master: ``before_send`` (nothing logged or sent), ``after_log``
(executions logged, nothing sent),
``after_send`` (sent, nothing collected), ``before_commit`` (results collected
from agents, not yet committed), ``after_commit`` (committed, not acknowledged).
On the path of a node given up on: ``lost_queued`` (its executions closed as lost
and handed to the log writer), ``giveups_committed`` (those rows committed, nothing
placed again logged yet), ``replacements_logged`` (the dispatches that place its
jobs again logged, nothing sent), ``replacements_sent`` (and sent).
``run_ended``: a serving master's run committed as ended, the request that asked
for it not yet settled.

``JODL_FAILPOINT_FREEZE=NAME:N`` makes the process SIGSTOP itself instead (it goes
on when sent SIGCONT), as a process the machine stops scheduling: ``lease_renewed``
(a lease renewal's UPDATE sent, the call not returned).

``JODL_FAILPOINT_SLOW=commit_lost:SECONDS`` makes the log writer take that long to
commit a batch that closes executions as lost (as under load), so a kill lands
while those rows are still on their way.
"""

from __future__ import annotations

import os
import signal
import time

_spec = os.environ.get("JODL_FAILPOINT", "") or os.environ.get("JODL_FAILPOINT_FREEZE", "")
_name, _, _count = _spec.partition(":")
_left = int(_count or 1) if _name else 0
_signal = signal.SIGKILL if os.environ.get("JODL_FAILPOINT") else signal.SIGSTOP


_slow_spec = os.environ.get("JODL_FAILPOINT_SLOW", "")
_slow_name, _, _slow_for = _slow_spec.partition(":")


def slow(name: str) -> bool:
    """Whether ``JODL_FAILPOINT_SLOW=NAME:SECONDS`` arms ``name`` (the caller then
    calls :func:`wait`, e.g. only for the batches the point is about)."""
    return name == _slow_name


def wait(name: str) -> None:
    """Sleep the armed seconds at ``name`` (a slow disk or a loaded database)."""
    if name == _slow_name:
        time.sleep(float(_slow_for or 1))


def hit(name: str) -> None:
    """Die at once (SIGKILL, no cleanup), or freeze (SIGSTOP), if ``name`` is the armed
    point and its turn came."""
    global _left
    if name != _name or _left <= 0:
        return
    _left -= 1
    if _left == 0:
        os.kill(os.getpid(), _signal)


__all__ = ["hit"]
