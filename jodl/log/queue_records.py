"""What the on-demand queue's statements return: claims and listed jobs (named records)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import NamedTuple

from .models import JobState

#: States a job of the on-demand queue can be in (the others belong to cycles).
QUEUE_STATES = (JobState.QUEUED, JobState.CLAIMED, JobState.DONE, JobState.DEAD)


class Claimed(NamedTuple):
    """A job taken from the queue: run it, then complete or fail it with ``attempt``.

    A named tuple, not a frozen dataclass: built once per job a serving master claims,
    and a frozen dataclass's fields are set one by one (a claim of 1,500 jobs: 1.7 µs a
    job to build and order its records, 0.9 so, with :meth:`QueueSQL.claim`'s sorts).
    """

    id: int
    family: str
    key: str
    payload: str
    priority: int
    #: The claim's attempt number: completion and failure must name it.
    attempt: int
    #: Failures since the job was last enqueued fresh.
    failures: int
    lease_until: dt.datetime
    permanent_node_id: int | None = None
    trial_node_id: int | None = None


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """One job of the queue as listed by :meth:`jodl.queue.Queue.jobs`."""

    id: int
    family: str
    key: str
    state: str
    due_at: dt.datetime | None
    priority: int
    attempts: int
    failures: int
    lease_until: dt.datetime | None
    last_error: str | None
    updated_at: dt.datetime
