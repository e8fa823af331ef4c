"""The page checker's metrics (on the agents, beside the library's ``jodl_*`` ones).

They join the process's default Prometheus registry when the page checker's families
are first imported, so an agent's ``/metrics`` shows them from its first page check.
"""

from __future__ import annotations

from prometheus_client import Counter

FETCHES = Counter(
    "jodl_fetches",
    "Page fetches, by outcome (ok, not_modified, http_error, or the error's kind)",
    ["outcome"],
)
POLITENESS_WAITS = Counter(
    "jodl_politeness_waits", "Fetches that waited for a host's politeness interval or pause"
)
POLITENESS_WAIT_SECONDS = Counter(
    "jodl_politeness_wait_seconds", "Seconds fetches spent waiting for politeness"
)
NOTIFICATIONS = Counter(
    "jodl_notifications_sent", "Notification digests, by outcome (sent, duplicate)", ["outcome"]
)
BROWSER_REQUESTS = Counter(
    "jodl_browser_requests",
    "Requests of pages rendered in the browser, by outcome (ok, refused, failed)",
    ["outcome"],
)
