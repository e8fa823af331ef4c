"""What every view shares: the app's services, the API test, the row-id converter.

The factory (:func:`web.app.create_app`) builds one :class:`Services` per app and keeps
it in ``app.extensions["jodl"]``; views reach it through :func:`services`. Nothing here
imports a blueprint or the factory, so every blueprint can import it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from flask import current_app, request
from sqlalchemy import Engine
from werkzeug.exceptions import NotFound
from werkzeug.routing import IntegerConverter

from crawler_app import AllowUsers
from jodl.log import ResultWatch, Store
from jodl.queue import Queue

from .batch import Batches
from .fanout import Fanout
from .metrics import Metrics
from .security import Limits
from .settings import WebSettings
from .slots import StreamSlots


@dataclass
class Services:
    """What the views share: settings, database, queue, batches, limits, counters."""

    settings: WebSettings
    engine: Engine
    store: Store
    queue: Queue
    batches: Batches
    limits: Limits
    metrics: Metrics
    #: Slots of open event streams (JODL_WEB_MAX_STREAMS, per client, operators').
    streams: StreamSlots
    #: Set when the server shuts down: open streams end at once.
    stopping: threading.Event
    #: Who may have pages fetched from the fetch allowlist's networks
    #: (JODL_FETCH_ALLOW_USERS, read and checked at start).
    allow_users: AllowUsers
    #: Wakes the event streams waiting for these jobs when they end (one per process).
    results: ResultWatch
    #: Reads new results once per notice and hands them to the open batch streams.
    fanout: Fanout


def services() -> Services:
    """The services of the current app."""
    found: Services = current_app.extensions["jodl"]
    return found


def is_api() -> bool:
    """True for requests to the JSON API (answered in JSON, errors too)."""
    return request.path.startswith("/api/") or request.path == "/api"


class IdConverter(IntegerConverter):
    """A row id in a URL: a whole number a database column holds (else 404, never 500)."""

    #: Largest id looked up (an integer column's largest value).
    MAX = 2**31 - 1

    def to_python(self, value: str) -> int:
        number = int(value)
        if not 1 <= number <= self.MAX:
            # Not "no such route" (another route with other methods would answer 405).
            raise NotFound("no such id")
        return number
