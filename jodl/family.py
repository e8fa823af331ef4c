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

A running job may be cancelled (``jodl run cancel``, ``jodl jobs delete``): its
result is discarded in any case, and a long job stops early when it looks::

    def run(self, payload):
        for chunk in chunks(payload):
            if cancelled():              # a check between two pieces of work
                return None
            work(chunk)
            if wait_cancelled(1.0):      # a pause that ends at once on cancel
                return None

An ``async def run`` has its task cancelled (``asyncio.CancelledError`` at its
next ``await``).

A family may declare its payload's type as a pydantic model; jobs are then checked
where they are added (``jodl.add_jobs``, ``jodl jobs add``, the queue, the HTTP API: a
bad one is refused with its index or line, and nothing is added) and ``run`` gets
the parsed object::

    class Size(pydantic.BaseModel):
        w: pydantic.PositiveInt
        h: pydantic.PositiveInt

    class Resize(Family):
        name = "resize"
        payload_model = Size

        def run(self, size: Size):
            return {"pixels": size.w * size.h}
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from functools import cache
from typing import Any, ClassVar

from .exceptions import BadPayload, UnknownFamily

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
    #: The payload's type: a pydantic model (any class with ``model_validate``), or
    #: None for the JSON object as it is. See :meth:`parse_payload`.
    payload_model: ClassVar[Any] = None

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
    def parse_payload(cls, payload: dict[str, Any]) -> Any:
        """``payload`` as :meth:`run` takes it: parsed by :attr:`payload_model` (a
        :class:`~jodl.exceptions.BadPayload` naming each field at fault), else as it is."""
        model = cls.payload_model
        if model is None:
            return payload
        try:
            return model.model_validate(payload)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise BadPayload(_fields_at_fault(exc)) from None

    @classmethod
    def is_async(cls) -> bool:
        """True when :meth:`run` is a coroutine function (runs on the agent's event loop)."""
        return inspect.iscoroutinefunction(cls.run)


class Cancellation:
    """How a running job hears that it was cancelled, and where it reports how far it
    is; the agent sets one per job.

    This one (outside an agent, e.g. a family's own tests) is never cancelled.
    """

    __slots__ = ()

    def is_set(self) -> bool:
        """True once the job was cancelled."""
        return False

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True (at once) when the job is or gets cancelled."""
        time.sleep(max(0.0, seconds))
        return False

    def report(self, done: float, total: float | None, note: str) -> None:
        """Where the job's progress goes; outside an agent, nowhere."""


#: The cancellation of the job running in this thread (or asyncio task); None: none.
current_cancellation: ContextVar[Cancellation | None] = ContextVar(
    "jodl_cancellation", default=None
)
_NEVER = Cancellation()


def cancelled() -> bool:
    """True when the job running in this thread (or task) was cancelled: stop early,
    its result is discarded anyway."""
    return (current_cancellation.get() or _NEVER).is_set()


def progress(done: float, total: float | None = None, note: str = "") -> None:
    """Say how far the job running in this thread (or task) is: ``done`` out of
    ``total`` (None: not known), with a short ``note``. The master collects it about
    once a second; ``jodl status``, the run page and the API show it while the job
    runs. Outside an agent it does nothing."""
    (current_cancellation.get() or _NEVER).report(done, total, note)


def wait_cancelled(seconds: float) -> bool:
    """Sleep up to ``seconds`` in a sync job; True, as soon as it happens, when the job
    was cancelled (then stop early), False when the time was slept."""
    return (current_cancellation.get() or _NEVER).wait(seconds)


class Permanent(Exception):
    """Raised by a family's ``run`` for a failure that no retry will fix."""


Retryable = Exception  # any other exception is retryable


@cache
def installed() -> dict[str, type[Family]]:
    """Families installed in this environment, by name."""
    from .settings.plugins import load_group

    found: dict[str, type[Family]] = {}
    for ep, cls in load_group(ENTRY_POINT_GROUP):
        if not (isinstance(cls, type) and issubclass(cls, Family)):
            continue
        found[ep.name] = cls
    return found


def reload_installed() -> dict[str, type[Family]]:
    """Families installed now, read again: entry points found anew (a package installed
    since), and the modules of other distributions' families imported again (a package
    upgraded since). This library's own families are not re-imported.

    A module that fails to import raises, and nothing changes for the caller.
    """
    import importlib
    import sys
    from importlib.metadata import entry_points

    from .settings.plugins import extra_installed

    importlib.invalidate_caches()
    own = (__name__.partition(".")[0],)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        module = sys.modules.get(ep.module)
        dist = getattr(ep, "dist", None)
        if module is None or (dist is not None and dist.name in own):
            continue
        importlib.reload(module)
    installed.cache_clear()
    extra_installed.cache_clear()
    return installed()


def installed_class(name: str) -> type[Family] | None:
    """The family class installed under ``name`` (None: none), importing only its module."""
    from .settings.plugins import load_entry

    cls = load_entry(ENTRY_POINT_GROUP, name)
    return cls if isinstance(cls, type) and issubclass(cls, Family) else None


#: Bad payloads named in one error at most.
BAD_PAYLOADS_SHOWN = 5


def payload_checker(name: str) -> Callable[[dict[str, Any]], Any] | None:
    """How jobs of the family installed here as ``name`` are checked where they are
    added: its :meth:`Family.parse_payload`, when it declares a payload model; None when
    it declares none or is not installed here (its agents check then, at the run).
    Looked up once per process, as :func:`installed` is."""
    cls = _installed_once(name)
    return cls.parse_payload if cls is not None and cls.payload_model is not None else None


@cache
def _installed_once(name: str) -> type[Family] | None:
    return installed_class(name)


def check_payloads(
    name: str, rows: Iterable[tuple[str, Any]], place: Callable[[int, str], str]
) -> None:
    """Check (key, payload) ``rows`` of family ``name`` (payloads as objects or JSON
    text) before any is added; :class:`BadPayload` naming the bad ones by ``place(index,
    key)``."""
    check = payload_checker(name)
    if check is None:
        return
    bad = []
    for n, (key, payload) in enumerate(rows):
        try:
            check(json.loads(payload) if isinstance(payload, str | bytes) else payload)
        except BadPayload as exc:
            bad.append(f"{place(n, key)}: {exc}")
            if len(bad) == BAD_PAYLOADS_SHOWN:
                break
    if bad:
        raise BadPayload("; ".join(bad) + "; no job added")


def _fields_at_fault(exc: ValueError) -> str:
    """A pydantic validation error as one line: ``field: reason`` for each field."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc).splitlines()[0]
    parts = []
    for error in errors():
        where = ".".join(str(part) for part in error.get("loc", ())) or "payload"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return ", ".join(parts)


def load(name: str) -> type[Family]:
    """The family class installed under ``name``, importing only its module;
    :class:`UnknownFamily` (naming every installed one) if there is none."""
    cls = installed_class(name)
    if cls is not None:
        return cls
    known = ", ".join(sorted(installed())) or "none"
    raise UnknownFamily(
        f"unknown family {name!r}: no entry point of that name in group "
        f"{ENTRY_POINT_GROUP!r} (installed: {known})"
    )
