"""Server-Sent Events: a batch's results in completion order, and operators' live status.

A batch stream first sends the items answered at submission (refused URLs and
cache hits), then follows the reconstruction log: it waits on its inbox of the
process's fan-out (:mod:`web.fanout`), which first looks for what committed before
the stream opened, then is told of every commit that ends
a waited-for job (:mod:`jodl.log.notices`: ``LISTEN``/``NOTIFY`` on PostgreSQL,
one listening connection per web process; on SQLite an in-process wake-up, when the
master runs in this process as with ``jodl up``), reads the new results once for
all streams and hands each stream those of its own items. Each new result goes out
at once, in commit order. A waiting stream queries nothing; where no notices come
(SQLite with the master in another process, or the listening connection down) the
fan-out polls every ``JODL_WEB_STREAM_POLL`` seconds, once for all streams. A last
``complete`` event says every item is answered.

Every event's id is a **cursor**: the set of positions delivered so far (a
bitmap). A reconnecting browser sends it back as ``Last-Event-ID`` and receives
exactly the items it has not seen, whatever order results committed in
meanwhile; the server keeps no per-client state.

Each open stream holds a thread of the WSGI server, so streams take slots
(:mod:`web.slots`: a shared pool below the thread count, a cap per user and per
address, the operators' own pool): a browser over the limit is told to retry a little later
and ordinary pages never wait. A stream ends when its client disconnects (the
server tells at once; without that, the next write finds out), and after
``JODL_WEB_STREAM_SECONDS``; the browser then resumes it.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Response, request
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import NotFound

from .admin import overview
from .auth import address_key, admin_required, client_key
from .batch import Item
from .fanout import Inbox
from .services import Services, services
from .slots import Slot

bp = Blueprint("stream", __name__)
log = logging.getLogger("web.stream")

#: Milliseconds a browser waits before it reconnects (the SSE ``retry`` field).
RETRY_MS = 1000
#: Milliseconds a browser turned away (all stream slots taken) waits.
BUSY_RETRY_MS = 3000
#: Seconds between two looks of a waiting stream at whether its client is still there
#: (waitress tells; no query), so that a slot is given back soon after a disconnect.
CLIENT_CHECK = 1.0
#: Longest pause between two looks while the database does not answer (seconds).
DB_BACKOFF_MAX = 5.0
#: Seconds between two status events of the operators' stream.
STATUS_EVERY = 1.0


class Cursor:
    """The positions of a batch already delivered, encoded as an event id."""

    def __init__(self, size: int, delivered: set[int] | None = None) -> None:
        self.size = size
        self.delivered = set(delivered or ())

    @classmethod
    def parse(cls, text: str | None, size: int) -> Cursor:
        """The cursor an event id names; an empty one when ``text`` is absent or malformed."""
        if not text or len(text) > 16 + 2 * size:
            return cls(size)
        count, _, packed = text.partition("-")
        try:
            raw = base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4))
            expected = int(count)
        except (ValueError, binascii.Error):
            return cls(size)
        delivered = {
            byte * 8 + bit for byte, value in enumerate(raw) for bit in range(8) if value >> bit & 1
        }
        if len(delivered) != expected or any(p >= size for p in delivered):
            return cls(size)
        return cls(size, delivered)

    def add(self, position: int) -> None:
        self.delivered.add(position)

    def __contains__(self, position: object) -> bool:
        return position in self.delivered

    @property
    def complete(self) -> bool:
        return len(self.delivered) >= self.size

    def text(self) -> str:
        raw = bytearray((self.size + 7) // 8)
        for p in self.delivered:
            raw[p // 8] |= 1 << (p % 8)
        packed = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
        return f"{len(self.delivered)}-{packed}"


def sse(event: str, data: Any, event_id: str | None = None) -> str:
    """One event in the wire format (JSON data on one line: no newline can break it)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _gone() -> Callable[[], bool]:
    """Whether this request's client has disconnected (waitress tells; else never)."""
    told = request.environ.get("waitress.client_disconnected")
    return told if callable(told) else (lambda: False)


def _take_slot(svc: Services, client: str, address: str, operator: bool) -> Slot | None:
    # Taken when the body starts (a body never started never gives a slot back).
    slot = svc.streams.take(client, address, operator)
    if slot is not None:
        svc.metrics.add("jodl_web_streams_open", 1)
    return slot


def _give_back(svc: Services, slot: Slot) -> None:
    svc.metrics.add("jodl_web_streams_open", -1)
    svc.streams.give_back(slot)


def _response(body: Iterator[str]) -> Response:
    response = Response(body, mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"  # no buffering in a reverse proxy
    return response


def batch_events(svc: Services, batch_id: str, last_event_id: str | None) -> Iterator[str]:
    """The event stream of one batch from the cursor ``last_event_id``."""
    loaded = svc.batches.load(batch_id)
    if loaded is None:
        raise NotFound("no such batch (batches are kept for a week)")
    _batch, items = loaded
    cursor = Cursor.parse(last_event_id, len(items))
    settings = svc.settings
    disconnected = _gone()
    client, address = client_key(), address_key()

    def generate() -> Iterator[str]:
        slot = _take_slot(svc, client, address, operator=False)
        if slot is None:
            yield f"retry: {BUSY_RETRY_MS}\n: busy, retry soon\n\n"
            return
        try:
            yield f"retry: {RETRY_MS}\n\n"
            yield from follow()
        finally:
            _give_back(svc, slot)

    def emit(event: dict[str, Any]) -> str:
        cursor.add(event["position"])
        svc.metrics.inc("jodl_web_events_total")
        return sse("result", event, cursor.text())

    def follow() -> Iterator[str]:
        waiting = [i for i in items if i.position not in cursor]
        # The events of one look go out in one write (one send, not one per result).
        first = "".join(emit(event) for event in svc.batches.immediate(waiting))
        if first:
            yield first
        pending = {i.position: i for i in waiting if i.pending}
        if not pending:
            if cursor.complete:
                yield sse("complete", {"total": len(items)}, cursor.text())
            return
        # Registered before the first look: a result committed meanwhile reaches it.
        inbox = svc.fanout.open(pending.values())
        try:
            yield from wait_for(pending, inbox)
        finally:
            svc.fanout.close(inbox)
        if cursor.complete:
            yield sse("complete", {"total": len(items)}, cursor.text())

    def wait_for(pending: dict[int, Item], inbox: Inbox) -> Iterator[str]:
        started = time.monotonic()
        quiet_since = started
        backoff = 0.0
        # The fan-out makes the first look; without it (the watch closed) the stream.
        catch_up = svc.results.closed
        while pending and not svc.stopping.is_set() and not disconnected():
            now = time.monotonic()
            answered: list[tuple[Item, dict[str, Any]]] = []
            if catch_up:
                try:
                    # The stream's own look (one query), to catch up (web.fanout).
                    answered = svc.batches.arrived(pending.values())
                    svc.fanout.settle(inbox, [item for item, _ in answered])
                    backoff = 0.0
                except SQLAlchemyError as exc:
                    # The database is away for a moment: look again later, less and less often.
                    backoff = min(DB_BACKOFF_MAX, max(backoff * 2, 0.1))
                    log.warning(
                        "event stream cannot read the log (retry in %.1fs): %s", backoff, exc
                    )
            handed, behind = svc.fanout.take(inbox)
            answered += [(a.item, a.event()) for a in handed]
            # Without the fan-out (the watch closed) the stream looks on its own clock.
            catch_up = behind or backoff > 0 or svc.results.closed
            out = [
                emit(event)
                for item, event in answered
                if pending.pop(item.position, None) is not None
            ]
            if out:
                yield "".join(out)
                quiet_since = now
            if not pending:
                break
            if now - started >= settings.web_stream_seconds:
                return  # the browser reconnects with the cursor and carries on
            if now - quiet_since >= settings.web_keepalive:
                quiet_since = now
                yield ": keep-alive\n\n"  # also finds out whether the client is gone
            if catch_up and not behind:
                pause = max(backoff, settings.web_stream_poll)
            else:
                pause = 0.0 if behind else CLIENT_CHECK
            pause = min(
                pause,
                max(0.0, quiet_since + settings.web_keepalive - now),
                max(0.0, started + settings.web_stream_seconds - now),
            )
            inbox.ready.wait(pause)

    return generate()


@bp.route("/batches/<batch_id>/events")
@bp.route("/api/batches/<batch_id>/events")
def batch_stream(batch_id: str) -> Response:
    """The results of a batch as Server-Sent Events (resumable with Last-Event-ID)."""
    last = request.headers.get("Last-Event-ID") or request.args.get("last_event_id")
    return _response(batch_events(services(), batch_id, last))


@bp.route("/admin/events")
@bp.route("/api/admin/events")
@admin_required
def admin_stream() -> Response:
    """Nodes, queue counts and runs (with live progress) every second, as events."""
    svc = services()
    disconnected = _gone()
    client, address = client_key(), address_key()

    def generate() -> Iterator[str]:
        slot = _take_slot(svc, client, address, operator=True)
        if slot is None:
            yield f"retry: {BUSY_RETRY_MS}\n: busy, retry soon\n\n"
            return
        try:
            yield f"retry: {RETRY_MS}\n\n"
            started = time.monotonic()
            number = 0
            while not svc.stopping.is_set() and not disconnected():
                number += 1
                try:
                    yield sse("status", overview(svc), str(number))
                except SQLAlchemyError as exc:
                    log.warning("status stream cannot read the database: %s", exc)
                if time.monotonic() - started >= svc.settings.web_stream_seconds:
                    return
                svc.stopping.wait(STATUS_EVERY)
        finally:
            _give_back(svc, slot)

    return _response(generate())
