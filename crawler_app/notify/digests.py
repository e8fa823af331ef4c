"""Digests: one per user per cycle, listing the user's changed pages, by e-mail and
to each of the user's notification channels (:mod:`crawler_app.notify.channels`).

:func:`prepare` turns the cycle's confirmed changes into one :class:`Notification`
row per user (its idempotency key ``digest-<cycle>-<user>`` names the ``notify``
job and builds the Message-ID) and one :class:`Delivery` per channel of the user
(key ``digest-<cycle>-<user>-c<channel>``, a ``notify`` job of its own), and commits
them with their jobs; :func:`record_outcomes` marks each e-mail and delivery sent or
failed from the ``notify`` run and retires the jobs.
"""

from __future__ import annotations

import json

from sqlalchemy.orm import Session

from jodl.log import JobLog, JobState, utcnow

from ..checking import change
from ..checking.variance import Model
from ..fetching.filters import describe_key
from ..models import (
    AppCycle,
    Delivery,
    Notification,
    NotificationState,
    Snapshot,
    decompress,
)
from ..settings import AppSettings
from ..users.pages import NOTIFY_FAMILY, family_id
from . import mail, queries


def prepare(s: Session, cycle: AppCycle, settings: AppSettings) -> int:
    """Notification rows and ``notify`` jobs for the cycle's changes; users that have
    one already (a redone step) are skipped. Returns the number of digests."""
    changes = queries.changes_of_cycle(s, cycle.id)
    if not changes:
        return 0
    # What each changed view learned to vary: left out of the diffs mailed.
    models = queries.view_models(s, {snap.page_id for snap, _ in changes})
    digests: dict[int, list[tuple[Snapshot, mail.ChangedPage]]] = {}
    emails: dict[int, str] = {}
    for snap, page in changes:
        previous = queries.previous_text(s, snap)
        item = mail.ChangedPage(
            url=page.url,
            title=page.title,
            selector=describe_key(snap.selector) or None,
            changed_at=snap.taken_at,
            diff=change.short_diff(
                decompress(previous) or "",
                snap.text,
                model=Model.from_json(models.get((snap.page_id, snap.selector))),
            ),
            page_id=page.id,
        )
        for user_id, address in queries.trackers_to_tell(s, snap.page_id, snap.selector):
            emails[user_id] = address
            digests.setdefault(user_id, []).append((snap, item))
    have = queries.users_with_digest(s, cycle.id)
    fid = family_id(s, NOTIFY_FAMILY)
    domain = settings.mail_from.rpartition("@")[2].strip(" >") or "localhost"
    stamp = cycle.started_at.strftime("%Y%m%d%H%M%S")
    for user_id in sorted(digests):
        if user_id in have:
            continue
        key = f"digest-{cycle.id}-{user_id}"
        message_id = f"<{key}.{stamp}@{domain}>"
        digest = mail.Digest(
            emails[user_id], [item for _, item in digests[user_id]], settings.app_url
        )
        subject, text, html = mail.render(digest)
        payload = {
            "key": key,
            "message_id": message_id,
            "from": settings.mail_from,
            "to": emails[user_id],
            "subject": subject,
            "text": text,
            "html": html,
        }
        job_id = JobLog.add_one(s.connection(), fid, key, json.dumps(payload))
        note = Notification(
            cycle_id=cycle.id,
            user_id=user_id,
            idem_key=key,
            message_id=message_id,
            state=NotificationState.PREPARED,
            job_id=job_id,
            snapshots=[snap.id for snap, _ in digests[user_id]],
            created_at=utcnow(),
        )
        s.add(note)
        s.flush()
        for channel_id in queries.channel_ids(s, user_id):
            # The same digest once more: the agent reads the channel's URL (its secrets)
            # from the table when it sends, so the job log never holds them.
            delivery_key = f"{key}-c{channel_id}"
            job_payload = {
                "key": delivery_key,
                "channel_id": channel_id,
                "title": subject,
                "body": text,
            }
            delivery_job = JobLog.add_one(
                s.connection(), fid, delivery_key, json.dumps(job_payload)
            )
            s.add(
                Delivery(
                    notification_id=note.id,
                    channel_id=channel_id,
                    idem_key=delivery_key,
                    state=NotificationState.PREPARED,
                    job_id=delivery_job,
                    created_at=utcnow(),
                )
            )
    row = s.get(AppCycle, cycle.id)
    assert row is not None
    row.notifications = len(digests)
    return len(digests)


def pending(s: Session, cycle_id: int) -> int:
    """E-mails and channel deliveries of the cycle not sent nor failed yet."""
    return queries.pending_count(s, cycle_id)


def record_outcomes(s: Session, cycle_id: int, run_id: int) -> int:
    """Mark the cycle's prepared e-mails and channel deliveries sent (a committed result
    in the ``notify`` run) or failed (the job is dead), and retire their jobs (``done``)
    so no later ``notify`` run sends them again. Returns the number sent."""
    notes = queries.prepared(s, cycle_id)
    conn = s.connection()
    outcomes = JobLog.outcomes(conn, [n.job_id for n in notes if n.job_id is not None], run_id)
    rows = [(n, outcomes[n.job_id]) for n in notes if n.job_id in outcomes]
    sent = 0
    for note, (_, job_state, job_error, result) in rows:
        if result is not None:
            note.state = NotificationState.SENT
            note.sent_at = utcnow()
            sent += 1
        elif job_state == JobState.DEAD:
            note.state = NotificationState.FAILED
            note.error = job_error
    JobLog.retire(conn, [note.job_id for note, _ in rows if note.job_id is not None])
    row = s.get(AppCycle, cycle_id)
    assert row is not None
    row.sent += sent
    return sent
