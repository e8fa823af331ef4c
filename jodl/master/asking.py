"""A cycle of a family another master leads: asked of that master through the log.

With families spread over several serving masters (docs/architecture.md#several-masters),
a cycle asked of a master that does not lead the family (by a schedule, or by an
application's cycle spanning several families) becomes a run request in the log,
which the family's leader takes and settles; the asker follows it from a thread.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from ..exceptions import JodlError
from ..log.models import Run
from ..log.store import Store
from .records import RunSummary

#: Seconds between two looks at the asked request.
FOLLOW_EVERY = 0.3


def ask_leader(store: Store, family: str) -> Future[RunSummary]:
    """File a cycle of ``family`` for its leader; the future gets the run's summary
    (cancelling the future stops following it, not the run)."""
    request_id = store.request_run(family)
    future: Future[RunSummary] = Future()
    started = time.perf_counter()

    def follow() -> None:
        while not future.cancelled():
            row = store.run_request(request_id)
            if row is None or row.finished_at is not None:
                break
            time.sleep(FOLLOW_EVERY)
        if not future.set_running_or_notify_cancel():
            return
        if row is None or row.error or row.run_id is None:
            reason = "disappeared" if row is None else row.error or row.summary or "not run"
            future.set_exception(JodlError(f"cycle of {family} asked of its leader: {reason}"))
            return
        with store.session() as s:
            run = s.get(Run, row.run_id)
        if run is None:
            future.set_exception(JodlError(f"run {row.run_id} of {family} disappeared"))
            return
        future.set_result(RunSummary.of_run(run, family, time.perf_counter() - started))

    threading.Thread(target=follow, name=f"ask-{family}", daemon=True).start()
    return future


__all__ = ["ask_leader"]
