"""The agent's replies as named records, and the check every reply passes before it is used.

A faulty or compromised agent must not crash the master nor slip a netref, a NaN
or a non-JSON result into the log: a reply of the wrong type or shape raises
:class:`BadReply`, and the master treats the node as faulty (unreachable). Every
call has its check here (the client applies it); values are tested by exact type, so a
netref (whose type is rpyc's proxy class) never passes.

Rows are :class:`~typing.NamedTuple` records: callers unpack them as tuples or
read them by field name, and a framed batch's columns are built straight into
records at C speed (see :func:`check_done`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

from ..exceptions import BadPayload
from .codec import VALUE_TYPES, decode_done_columns, decode_failed, loads_object

#: How the agent words its refusal of a master of an older epoch (a newer master
#: took over): the client raises :class:`jodl.exceptions.Fenced` on it.
FENCED = "fenced: epoch"
#: How a refusal of an execution id the agent already knows begins (the master
#: retries such a job elsewhere instead of declaring it dead).
KNOWN_ID = "execution id already known on agent"


class DoneRow(NamedTuple):
    """A job the agent ran to its end (``done``)."""

    exec_id: int
    duration: float  #: seconds the job ran
    finished: float  #: unix time it finished
    result: str  #: the result, JSON


class FailedRow(NamedTuple):
    """A job that raised on the agent (``failed``), or that it refused (see :class:`Refused`)."""

    exec_id: int
    duration: float
    finished: float
    error: str
    retryable: bool


class Refused(NamedTuple):
    """An execution ``send`` did not queue, and why (e.g. a family unknown there)."""

    exec_id: int
    reason: str

    @property
    def known_id(self) -> bool:
        """The agent had this id already (finished, taken back or cancelled there)."""
        return self.reason.startswith(KNOWN_ID)


class Remaining(NamedTuple):
    """What the agent holds (``remaining``)."""

    queued: int
    running: int
    held_done: int
    held_failed: int


class ProgressReport(NamedTuple):
    """How far a running job is, as it said (``progress``; :func:`jodl.progress`)."""

    exec_id: int
    done: float
    total: float | None
    note: str
    at: float  # unix time of the report


class Ping(NamedTuple):
    """The agent's name, epoch and clock (``ping``)."""

    name: str
    epoch: int
    time: float


class AgentFamily(NamedTuple):
    """A family installed on the agent (``families``, and ``init``'s info)."""

    name: str
    version: str
    is_async: bool  #: runs on the agent's event loop (async slots)
    idempotent: bool  #: may run twice (backup copies)


class Leader(NamedTuple):
    """A family as an agent sees its leader: the newest epoch it was led at, and by
    which master ("" when that master's session ended)."""

    family: str
    epoch: int
    master: str


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What ``init`` says about the agent."""

    name: str
    slots: int
    async_slots: int
    speed: float
    epoch: int
    event_loop: str
    families: Mapping[str, AgentFamily]
    #: The connection the agent now serves: later calls carry it in their stamp.
    session: int
    #: Seconds of silence after which the agent starts nothing queued (None: never).
    detach: float | None
    #: Executions queued there, not started (the master cancels those it gave up on).
    queued: tuple[int, ...]
    #: Bumped each time the agent reloaded its families with a change (``reload``).
    generation: int = 0
    #: Where its ops endpoint (health, /metrics) listens, HOST:PORT; "" when none.
    ops: str = ""
    #: The agent has traces on: the master sends it each job's trace context (an older
    #: agent says nothing and gets none).
    traces: bool = False

    def family_table(self) -> dict[str, dict[str, Any]]:
        """The families as the log keeps them per node: name -> version, async, idempotent."""
        return {
            f.name: {"version": f.version, "async": f.is_async, "idempotent": f.idempotent}
            for f in self.families.values()
        }


class BadReply(ValueError):
    """An agent's reply is not of the type and shape its call defines."""


def _kind(value: Any) -> str:
    return type(value).__name__ if type(value) in (*VALUE_TYPES, tuple) else "a netref/object"


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def check_ids(value: Any) -> tuple[int, ...]:
    """A plain tuple of execution ids (``take_back``, ``cancel``, ``held``)."""
    if type(value) is not tuple or any(type(v) is not int for v in value):
        raise BadReply(f"a plain tuple of ints expected, got {_kind(value)}")
    return value


_json_decoder = json.JSONDecoder()
_json_decode = _json_decoder.decode
#: The decoder's scanner (C): ``(value, end)`` of the JSON value at an index.
_json_scan = _json_decoder.scan_once  # type: ignore[attr-defined]  # set by its __init__
_end = itemgetter(1)


def _check_json(results: list[str], ids: Any) -> None:
    # A compact JSON value (as agents send them) scans to its own length: all of them
    # checked in C, 0.55 µs a result against 1.4 through ``decode``, once per result in
    # the master's loop. Anything else (surrounding whitespace, or an error, which may
    # also end the ``map`` early as a StopIteration) is judged one by one by ``decode``.
    try:
        if list(map(_end, map(_json_scan, results, repeat(0)))) == list(map(len, results)):
            return
    except ValueError:
        pass
    for exec_id, result in zip(ids, results, strict=True):
        if not _is_json(result):
            raise BadReply(f"done: the result of execution {exec_id} is not JSON")


def _is_json(text: str) -> bool:
    try:
        _json_decode(text)
    except ValueError:
        return False
    return True


def check_done(value: Any) -> list[DoneRow]:
    """Decode and check a ``done`` reply (framed str or tuple): ids, finite times, JSON results."""
    if type(value) is str:
        # The framed batch decodes by column to ints, floats and strs already: what
        # is left to check runs at C speed but the JSON of each result.
        try:
            ids, durations, finished, results = decode_done_columns(value)
        except ValueError as exc:
            raise BadReply(f"malformed done batch ({exc})") from None
        if ids:
            if not (
                all(map(math.isfinite, durations))
                and all(map(math.isfinite, finished))
                and min(durations) >= 0
            ):
                raise BadReply("done: durations and finish times must be finite, durations >= 0")
            _check_json(results, ids)
        # tuple.__new__ builds each record in C from zip's row: DoneRow(...) per row
        # would run the record's Python-level __new__ (measured: twice as slow).
        rows = zip(ids, durations, finished, results, strict=True)
        return list(map(tuple.__new__, repeat(DoneRow), rows))
    if type(value) is not tuple:
        raise BadReply(f"done: a str or tuple expected, got {_kind(value)}")
    for row in value:
        if (
            type(row) is not tuple
            or len(row) != 4
            or type(row[0]) is not int
            or not (_finite(row[1]) and _finite(row[2]) and row[1] >= 0)
            or type(row[3]) is not str
        ):
            raise BadReply("done: rows of (int, duration, finish time, result JSON) expected")
    _check_json([row[3] for row in value], [row[0] for row in value])
    return list(map(DoneRow._make, value))


def check_outcomes(value: Any) -> tuple[list[DoneRow], list[FailedRow]]:
    """Decode and check an ``outcomes`` reply: (framed results, framed failures)."""
    if type(value) is not tuple or len(value) != 2:
        raise BadReply(f"outcomes: a pair of batches expected, got {_kind(value)}")
    return check_done(value[0]), check_failed(value[1])


def check_exchange(value: Any) -> tuple[tuple[Refused, ...], list[DoneRow], list[FailedRow]]:
    """Decode and check an ``exchange`` reply: (refused, framed results, framed failures)."""
    if type(value) is not tuple or len(value) != 3:
        raise BadReply(
            f"exchange: a triple (refused, results, failures) expected, got {_kind(value)}"
        )
    return check_refused(value[0]), check_done(value[1]), check_failed(value[2])


def check_failed(value: Any) -> list[FailedRow]:
    """Decode and check a ``failed`` reply (framed str or tuple)."""
    if type(value) is str:
        try:
            rows: Any = decode_failed(value)
        except ValueError as exc:
            raise BadReply(f"malformed failed batch ({exc})") from None
    elif type(value) is tuple:
        rows = value
    else:
        raise BadReply(f"failed: a str or tuple expected, got {_kind(value)}")
    for row in rows:
        if (
            type(row) is not tuple
            or len(row) != 5
            or type(row[0]) is not int
            or not (_finite(row[1]) and _finite(row[2]) and row[1] >= 0)
            or type(row[3]) is not str
            or type(row[4]) is not bool
        ):
            raise BadReply("failed: rows of (int, duration, time, error, retryable) expected")
    return list(map(tuple.__new__, repeat(FailedRow), rows))


def check_refused(value: Any) -> tuple[Refused, ...]:
    """The executions ``send`` refused: (exec_id, reason) rows."""
    if type(value) is not tuple or any(
        type(r) is not tuple or len(r) != 2 or type(r[0]) is not int or type(r[1]) is not str
        for r in value
    ):
        raise BadReply(f"send: a tuple of (int, str) expected, got {_kind(value)}")
    return tuple(map(Refused._make, value))


def check_remaining(value: Any) -> Remaining:
    """Four counts (queued, running, held done, held failed)."""
    if len(check_ids(value)) != 4 or any(v < 0 for v in value):
        raise BadReply("remaining: four counts expected")
    return Remaining._make(value)


def check_progress(value: Any) -> tuple[ProgressReport, ...]:
    """(exec_id, done, total or None, note, unix time) per running job that reported."""
    if type(value) is not tuple:
        raise BadReply(f"progress: a tuple expected, got {_kind(value)}")
    out = []
    for row in value:
        if (
            type(row) is not tuple
            or len(row) != 5
            or type(row[0]) is not int
            or type(row[1]) is not float
            or not (row[2] is None or type(row[2]) is float)
            or type(row[3]) is not str
            or type(row[4]) is not float
        ):
            raise BadReply(f"progress: (exec_id, done, total, note, time) rows, got {_kind(row)}")
        out.append(ProgressReport._make(row))
    return tuple(out)


def check_ping(value: Any) -> Ping:
    """(name, epoch, unix time)."""
    if (
        type(value) is not tuple
        or len(value) != 3
        or type(value[0]) is not str
        or type(value[1]) is not int
        or not _finite(value[2])
    ):
        raise BadReply("ping: (name, epoch, time) expected")
    return Ping._make(value)


def check_families(value: Any) -> tuple[AgentFamily, ...]:
    """(name, version, is_async, idempotent) rows; an agent before the last field sends three."""
    if type(value) is not tuple or any(
        type(f) is not tuple
        or len(f) not in (3, 4)
        or type(f[0]) is not str
        or type(f[1]) is not str
        or any(type(flag) is not bool for flag in f[2:])
        for f in value
    ):
        raise BadReply("families: a tuple of (name, version, is_async, idempotent) expected")
    return tuple(AgentFamily(f[0], f[1], f[2], len(f) == 4 and f[3]) for f in value)


def check_leaders(value: Any) -> tuple[Leader, ...]:
    """(family, epoch, master) rows (``leaders``)."""
    if type(value) is not tuple or any(
        type(f) is not tuple
        or len(f) != 3
        or type(f[0]) is not str
        or type(f[1]) is not int
        or type(f[2]) is not str
        for f in value
    ):
        raise BadReply("leaders: a tuple of (family, epoch, master) expected")
    return tuple(Leader(*f) for f in value)


def check_flag(value: Any) -> bool:
    """A plain bool (``draining``)."""
    if type(value) is not bool:
        raise BadReply(f"a bool expected, got {_kind(value)}")
    return value


def check_count(value: Any) -> int:
    """A count (``ack``: how many results the agent forgot)."""
    if type(value) is not int or value < 0:
        raise BadReply(f"a count expected, got {_kind(value)}")
    return value


#: The keys of ``init``'s agent info and their JSON types (``detach`` may be null).
_INFO_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "slots": (int,),
    "async_slots": (int,),
    "speed": (int, float),
    "epoch": (int,),
    "event_loop": (str,),
    "families": (dict,),
    "session": (int,),
    "detach": (int, float, type(None)),
    "queued": (list,),
}


def check_info(value: Any) -> AgentInfo:
    """Decode and check the agent info ``init`` returns (a JSON object of typed keys)."""
    if type(value) is not str:
        raise BadReply(f"init: a JSON str expected, got {_kind(value)}")
    try:
        info = loads_object(value, "agent info")
    except BadPayload as exc:
        raise BadReply(f"init: {exc}") from None
    for key, types in _INFO_KEYS.items():
        if type(info.get(key)) not in types:
            raise BadReply(f"init: {key!r} of the agent info is missing or has the wrong type")
    if any(type(i) is not int for i in info["queued"]):
        raise BadReply("init: 'queued' of the agent info holds a non-integer id")
    if info["slots"] < 1 or info["async_slots"] < 0:
        raise BadReply("init: slot counts out of range")
    if not (math.isfinite(info["speed"]) and info["speed"] > 0):
        raise BadReply("init: speed out of range")
    families = {}
    for name, fam in info["families"].items():
        if (
            type(fam) is not dict
            or type(fam.get("version", "")) is not str
            or type(fam.get("async", False)) is not bool
            or type(fam.get("idempotent", False)) is not bool
        ):
            raise BadReply(f"init: family {name!r} of the agent info is malformed")
        families[name] = AgentFamily(
            name,
            fam.get("version", ""),
            fam.get("async", False),
            fam.get("idempotent", False),
        )
    return AgentInfo(
        name=info["name"],
        slots=info["slots"],
        async_slots=info["async_slots"],
        speed=float(info["speed"]),
        epoch=info["epoch"],
        event_loop=info["event_loop"],
        families=families,
        session=info["session"],
        detach=info["detach"],
        queued=tuple(info["queued"]),
        generation=_generation(info.get("generation", 0)),
        ops=_ops_address(info.get("ops", "")),
        traces=info.get("traces") is True,
    )


def _ops_address(value: Any) -> str:
    """The agent's ops address: "" or HOST:PORT (an older agent says none)."""
    if value == "":
        return ""
    host, _, port = value.rpartition(":") if type(value) is str else ("", "", "")
    if (
        not host
        or len(value) > 300
        or not port.isdigit()
        or not 0 < int(port) < 65536
        or any(c.isspace() or c in "/?#@" for c in value)
    ):
        raise BadReply("init: 'ops' of the agent info is not HOST:PORT")
    return str(value)


def _generation(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise BadReply("init: 'generation' of the agent info is not a count")
    return value
