"""Calls to several agents at once, so a hung agent stalls nobody.

The loop makes one call per agent per step (send, collect) and reconnects to
agents it lost. Made one after the other, a frozen agent cost the full call
timeout on every call and every reconnect, and every other agent waited meanwhile
(400 jobs of 20 ms on two agents took about 31 s instead of 2 s with one of them
SIGSTOPped). Here the calls of one step to different agents go out at once on a
small pool of threads, and reconnects run in the background; a step therefore
waits at most one call timeout for a frozen agent, once (its link is then closed:
the node is suspect, see :mod:`jodl.master.nodes` and docs/architecture.md).

Rules that keep this safe (rpyc connections are not shared between threads):

* at most one call in flight per link: a step gives each link one piece of work,
  and a link being reopened in the background is not usable until the loop has
  taken the outcome;
* workers do I/O only and hand back the reply or the exception, as a value; the
  loop thread applies them to the job book, which stays its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar, cast

_R = TypeVar("_R")
_K = TypeVar("_K")

#: Threads for calls to agents. A step makes one call per agent; more agents than
#: threads wait for a free one, which costs nothing while agents answer in a
#: millisecond, and a frozen agent holds one thread for one call timeout at most.
CALL_THREADS = 16


class Outcome(Generic[_R]):
    """The reply of one call, or the exception it raised (re-raised by :meth:`get`)."""

    __slots__ = ("error", "value")

    def __init__(self, value: _R | None = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    def get(self) -> _R:
        if self.error is not None:
            raise self.error
        return cast(_R, self.value)  # no error: the call returned this


def _run(work: Callable[[], _R]) -> Outcome[_R]:
    try:
        return Outcome(work())
    except Exception as exc:  # noqa: BLE001 - handed to the loop thread, which decides
        return Outcome(error=exc)


class Calls:
    """A pool for calls to agents: :meth:`each` for a step's calls, :meth:`start` for
    a call whose reply the loop picks up later."""

    def __init__(self, threads: int = CALL_THREADS) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="jodl-call")
        return self._pool

    def each(self, work: Mapping[_K, Callable[[], _R]]) -> dict[_K, Outcome[_R]]:
        """Run every piece of ``work`` (one per link) at once; their outcomes by key.

        The last one runs in the calling thread: with one agent no thread is woken,
        and with several the loop thread makes one of the calls itself.
        """
        items = list(work.items())
        if not items:
            return {}
        *others, (last_key, last) = items
        futures = [(key, self._executor().submit(_run, fn)) for key, fn in others]
        out = {last_key: _run(last)}
        for key, future in futures:
            out[key] = future.result()
        return out

    def start(self, work: Callable[[], _R]) -> Future[Outcome[_R]]:
        """Run ``work`` in the background; the loop takes its outcome when done."""
        return self._executor().submit(_run, work)

    def close(self) -> None:
        """Stop the threads (calls in flight end by their timeout; not waited for)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["CALL_THREADS", "Calls", "Outcome"]
