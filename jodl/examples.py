"""Small example families for tests and benchmarks."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from .family import Family, Permanent, cancelled, progress, wait_cancelled


class Noop(Family):
    """Returns at once; measures the dispatch overhead."""

    name = "noop"
    idempotent = True

    def run(self, payload: dict[str, Any]) -> Any:
        return None


class Sleep(Family):
    """Sleeps ``payload["seconds"]`` divided by the agent's speed factor (less when
    cancelled: then it returns at once)."""

    name = "sleep"
    idempotent = True

    def run(self, payload: dict[str, Any]) -> Any:
        seconds = float(payload.get("seconds", 0.0)) / float(self.context.get("speed", 1.0))
        if wait_cancelled(seconds):
            return None  # discarded by the agent
        return {"slept": seconds}


class AsyncSleep(Family):
    """Awaits ``payload["seconds"]`` on the agent's event loop; names that loop."""

    name = "asleep"
    idempotent = True

    async def run(self, payload: dict[str, Any]) -> Any:
        from .agent.eventloop import loop_name

        await asyncio.sleep(max(0.0, float(payload.get("seconds", 0.0))))
        return {"loop": loop_name(asyncio.get_running_loop())}


class AlwaysFail(Family):
    """Always fails (``payload["permanent"]`` makes the failure not retryable)."""

    name = "fail"

    def run(self, payload: dict[str, Any]) -> Any:
        if payload.get("permanent"):
            raise Permanent(payload.get("message", "failed on purpose"))
        raise RuntimeError(payload.get("message", "failed on purpose"))


class FailFirst(Family):
    """Fails the first ``payload["times"]`` runs of each ``payload["key"]`` on this agent."""

    name = "flaky"

    def __init__(self, context: dict[str, Any] | None = None) -> None:
        super().__init__(context)
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def run(self, payload: dict[str, Any]) -> Any:
        key = str(payload.get("key", ""))
        with self._lock:
            count = self._seen.get(key, 0) + 1
            self._seen[key] = count
        if count <= int(payload.get("times", 1)):
            raise RuntimeError(f"attempt {count} of {key!r} fails on purpose")
        return {"attempt": count}


class Mark(Family):
    """Leaves a mark outside JODL: appends ``"<node> <key>\\n"`` to ``payload["path"]``.

    The line is written (O_APPEND, one write) when the job starts, then the job sleeps
    ``payload["seconds"]``: the file tells which jobs really ran where and how often,
    whatever the log says. Not idempotent: a second run leaves a second mark. With
    ``payload["end"]`` true it appends ``"<node> <key> end\n"`` when the sleep is over,
    so the file also tells which jobs ran at the same time. Cancelled, it stops at
    once: before its start it writes nothing, during its sleep no end line.
    """

    name = "mark"

    def run(self, payload: dict[str, Any]) -> Any:
        if cancelled():
            return None
        self._write(payload, f"{self.context.get('node', '')} {payload['key']}\n")
        if wait_cancelled(float(payload.get("seconds", 0.0))):
            return None  # discarded by the agent; no end line
        if payload.get("end"):
            self._write(payload, f"{self.context.get('node', '')} {payload['key']} end\n")
        return {"marked": payload["key"]}

    @staticmethod
    def _write(payload: dict[str, Any], line: str) -> None:
        fd = os.open(str(payload["path"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class Steps(Family):
    """Takes ``payload["steps"]`` steps of ``payload["seconds"]`` each, saying how far it
    is after each (:func:`jodl.progress`); stops early when cancelled."""

    name = "steps"
    idempotent = True

    def run(self, payload: dict[str, Any]) -> Any:
        steps = int(payload.get("steps", 3))
        for step in range(steps):
            progress(step, steps, f"step {step + 1} of {steps}")
            if wait_cancelled(float(payload.get("seconds", 1.0))):
                return None
        return {"steps": steps}
