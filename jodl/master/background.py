"""Reads the loop does not wait for: :func:`in_background`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def in_background(read: Callable[[], T], name: str) -> Future[T]:
    """``read()`` in a thread of its own; its result (or error) in the future returned.

    The loop takes the result when it needs it (``future.result()`` raises the read's
    error there, in the loop's thread, where an outage is handled). Its own thread,
    not the pool of calls to agents (:meth:`~jodl.master.calls.Calls.start`): a read
    of a million jobs holds its thread for a second or more, and that pool's threads
    are the ones a step's calls to agents wait for. The read's database waits and
    the loop's waits for agents then overlap.
    """
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(read())
        except BaseException as exc:  # noqa: BLE001 - handed to the reader of the future
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
