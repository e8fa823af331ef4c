"""The on-demand queue: delayed, unique, prioritised, at-least-once, on disk.

Any family's jobs can be enqueued at any time with a due time and a priority.
The queue lives in the job table itself (``jodl_job``), so it is as durable as
the reconstruction log and as large as the disk:

* **unique**: (family, key) is one row. Enqueueing an existing key moves its
  due time, takes the new payload and keeps the higher priority; a done, dead
  or deleted key is queued afresh. A key enqueued again *while it runs* runs
  once more after that run succeeds (no update is lost).
* **delayed and prioritised**: among due jobs the highest priority is claimed
  first, then the earliest due.
* **at least once**: a claim carries a lease. The holder renews it while the
  job runs; when the holder dies the lease ends and the job is queued again
  (counted as a failure). A job may therefore run twice, never zero times.
* **attempt-guarded**: every claim numbers its attempt (``Job.attempts`` never
  goes back). Completion and failure name the attempt, and only a job still
  claimed by that attempt changes; a late result of a superseded attempt
  changes nothing.
* **dead letters**: a job that failed ``max_attempts`` times in all (errors and
  ended leases) is dead: kept, counted, listed and re-queueable.

Claims use ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so masters and other
consumers never wait on each other's rows, and enqueues ``NOTIFY`` a channel
that :meth:`Queue.wait` and :class:`QueueFeeder` ``LISTEN`` on. On SQLite one
``UPDATE ... RETURNING`` statement claims atomically and waiting is short polling.

A failed attempt of a job run by the master goes back to the queue, due after
:func:`jodl.log.outcomes.retry_delay` (exponential backoff), rather than being retried
at once inside the master: the failure count is then on disk, survives a
restart of the master, and the job may go to whichever master claims it next.

Layout: :mod:`jodl.queue.queue` holds the public :class:`Queue` and its
settings, :mod:`jodl.queue.feeder` the master's side (:class:`QueueFeeder`);
every statement lives in :mod:`jodl.log.queue_sql`.
"""

from ..log.queue_records import Claimed, QueuedJob
from .feeder import QueueFeeder
from .queue import (
    CHECK_INTERVAL,
    CLAIM_BATCH,
    DEFAULT_LEASE,
    DEFAULT_POLL,
    OPTIONS,
    WAKE_MAX,
    Payload,
    Queue,
    payload_text,
)

__all__ = [
    "CHECK_INTERVAL",
    "CLAIM_BATCH",
    "DEFAULT_LEASE",
    "DEFAULT_POLL",
    "OPTIONS",
    "WAKE_MAX",
    "Claimed",
    "Payload",
    "Queue",
    "QueueFeeder",
    "QueuedJob",
    "payload_text",
]
