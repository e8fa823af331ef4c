"""What an agent holds for the master: its rows of results and failures."""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

from ..exceptions import BadPayload, UnknownFamily
from ..family import Permanent

#: Longest error text kept for one failure.
MAX_ERROR = 2000
_RESULT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

Done = tuple[int, float, float, str]  # exec_id, duration, finished (unix), result JSON
Failed = tuple[int, float, float, str, bool]  # exec_id, duration, finished, error, retryable


class Held(NamedTuple):
    """The row an agent holds for one run, and which of its two tables it goes to."""

    done: Done | None
    failed: Failed | None


def held_row(exec_id: int, duration: float, outcome: Any, error: BaseException | None) -> Held:
    """The row an agent holds for one run: a :data:`Done` with the result as JSON, or a
    :data:`Failed` (a result that is not JSON fails the job too)."""
    finished = time.time()
    if error is None:
        if outcome is None:  # most jobs that return nothing: the encoder's call cost 2 µs
            return Held((exec_id, duration, finished, "null"), None)
        try:
            return Held((exec_id, duration, finished, _RESULT.encode(outcome)), None)
        except (TypeError, ValueError) as exc:
            error = exc
    retryable = not isinstance(error, Permanent | UnknownFamily | BadPayload)
    message = f"{type(error).__name__}: {error}"[:MAX_ERROR]
    return Held(None, (exec_id, duration, finished, message, retryable))


__all__ = ["MAX_ERROR", "Done", "Failed", "Held", "held_row"]
