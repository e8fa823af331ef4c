"""Job families: the code an agent runs for a job, found by name.

A family is a class with a ``name``, a ``version`` and a ``run(payload)`` method
(plain or ``async def``). It is installed on agents as a package entry point in
the group ``jodl.families``; job code is never shipped over the wire.

Example::

    class Resize(Family):
        name = "resize"
        version = "1"

        def run(self, payload):
            return {"pixels": payload["w"] * payload["h"]}

and in the package's setup.cfg::

    [options.entry_points]
    jodl.families =
        resize = mypackage.families:Resize
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any, ClassVar

from .exceptions import UnknownFamily

ENTRY_POINT_GROUP = "jodl.families"


class Family:
    """Base class of job families.

    Subclasses set :attr:`name` and :attr:`version` and implement :meth:`run`.
    An instance is created once per agent with the agent's context and reused
    for every job, from several threads at once for sync families.
    """

    #: The name jobs refer to; equal to the entry point's name.
    name: ClassVar[str] = ""
    #: Bumped when results of the same payload may differ; the master checks it.
    version: ClassVar[str] = "1"
    #: True when running a job twice is harmless (allows straggler backups).
    idempotent: ClassVar[bool] = False

    def __init__(self, context: dict[str, Any] | None = None) -> None:
        #: Agent-side settings: ``speed``, ``node`` and the master's family settings.
        self.context: dict[str, Any] = dict(context or {})

    def run(self, payload: dict[str, Any]) -> Any:
        """Do the job described by ``payload`` (a JSON object) and return a JSON value.

        Raise :class:`Retryable` for a failure worth trying again elsewhere; any
        other exception is recorded as a failure too and retried up to the
        family's limit of attempts.
        """
        raise NotImplementedError

    @classmethod
    def is_async(cls) -> bool:
        """True when :meth:`run` is a coroutine function (runs on the agent's event loop)."""
        return inspect.iscoroutinefunction(cls.run)


class Permanent(Exception):
    """Raised by a family's ``run`` for a failure that no retry will fix."""


Retryable = Exception  # any other exception is retryable


@cache
def installed() -> dict[str, type[Family]]:
    """Families installed in this environment, by name."""
    from .plugins import load_group

    found: dict[str, type[Family]] = {}
    for ep, cls in load_group(ENTRY_POINT_GROUP):
        if not (isinstance(cls, type) and issubclass(cls, Family)):
            continue
        found[ep.name] = cls
    return found


def load(name: str) -> type[Family]:
    """The family class installed under ``name``; :class:`UnknownFamily` if there is none."""
    try:
        return installed()[name]
    except KeyError:
        known = ", ".join(sorted(installed())) or "none"
        raise UnknownFamily(
            f"unknown family {name!r}: no entry point of that name in group "
            f"{ENTRY_POINT_GROUP!r} (installed: {known})"
        ) from None
