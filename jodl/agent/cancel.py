"""Cancelling running jobs on an agent: what a job consults, and what the agent sets.

A job the master cancels while it runs keeps its slot until its code returns; this
makes it return early when it cooperates (:func:`jodl.family.cancelled`,
:func:`jodl.family.wait_cancelled`), and cancels the asyncio task of an async job.
Its result is discarded whatever it returns.
"""

from __future__ import annotations

import asyncio
import threading

from ..family import Cancellation
from .progress import ProgressBoard


class Cancels:
    """The agent's running executions that were cancelled, and how their jobs hear it.

    ``cancelled``: exec ids cancelled while running (their outcomes are discarded);
    ``_events``: exec id -> the Event its job waits on (made by its first wait only,
    so a job of microseconds costs no Event); ``_tasks``: exec id -> an async job's task;
    ``board``: where the jobs' progress reports go (the handle a job consults is one).
    """

    def __init__(self) -> None:
        self.board = ProgressBoard()
        self.cancelled: set[int] = set()
        self._events: dict[int, threading.Event] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._lock = threading.Lock()

    def cancel(self, exec_id: int) -> None:
        """Mark a running execution cancelled: its waits end, its task is cancelled."""
        with self._lock:
            self.cancelled.add(exec_id)
            event = self._events.get(exec_id)
            task = self._tasks.get(exec_id)
        if event is not None:
            event.set()
        if task is not None:
            task.get_loop().call_soon_threadsafe(task.cancel)

    def of(self, exec_id: int) -> JobCancellation:
        """What the job of ``exec_id`` consults (set as its current cancellation)."""
        return JobCancellation(self, exec_id)

    def track(self, exec_id: int, task: asyncio.Task[None]) -> None:
        """An async job's task, cancelled with it (at once if it already was)."""
        with self._lock:
            self._tasks[exec_id] = task
            already = exec_id in self.cancelled
        if already:
            task.cancel()

    def event(self, exec_id: int) -> threading.Event:
        with self._lock:
            event = self._events.get(exec_id)
            if event is None:
                event = self._events[exec_id] = threading.Event()
                if exec_id in self.cancelled:
                    event.set()
            return event

    def finished(self, exec_id: int) -> bool:
        """The execution ended: forget it; True when it was cancelled (discard it)."""
        with self._lock:
            self._events.pop(exec_id, None)
            self._tasks.pop(exec_id, None)
            if exec_id in self.cancelled:
                self.cancelled.discard(exec_id)
                return True
            return False


class JobCancellation(Cancellation):
    """The cancellation of the execution ``exec_id`` (see :class:`Cancels`). A job slot
    keeps one and points it at each job it runs: nothing is made per job."""

    __slots__ = ("_cancels", "exec_id")

    def __init__(self, cancels: Cancels, exec_id: int) -> None:
        self._cancels = cancels
        self.exec_id = exec_id

    def report(self, done: float, total: float | None, note: str) -> None:
        self._cancels.board.report(self.exec_id, done, total, note)

    def is_set(self) -> bool:
        return self.exec_id in self._cancels.cancelled

    def wait(self, seconds: float) -> bool:
        if seconds <= 0 or self.is_set():
            return self.is_set()
        return self._cancels.event(self.exec_id).wait(seconds)


__all__ = ["Cancels", "JobCancellation"]
