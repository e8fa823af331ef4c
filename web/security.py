"""CSRF tokens, security headers and the submission rate limit of the web UI.

* **CSRF**: one random token per session (in the signed session cookie). Every
  state-changing form carries it in a hidden field; JSON requests authenticated
  by the session cookie carry it in the ``X-CSRF-Token`` header. Requests
  authenticated by HTTP Basic credentials carry no ambient authority and need none.
* **Headers**: a Content-Security-Policy without ``unsafe-inline`` (every script
  and style is a file under ``/static``), no framing, no MIME sniffing, no referrer
  leaks to other sites; HSTS when the session cookie is HTTPS-only.
* **Rate limit**: a token bucket per client key (user id, else address) in the
  process; enough for one web process, and the first line of defence behind a proxy.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from flask import Response, session

#: Session key of the CSRF token, form field and header that carry it.
CSRF_KEY = "csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"

CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
}


def csrf_token() -> str:
    """This session's CSRF token (created on first use)."""
    token = session.get(CSRF_KEY)
    if not isinstance(token, str) or len(token) < 32:
        token = secrets.token_urlsafe(32)
        session[CSRF_KEY] = token
    return token


def csrf_valid(candidate: object) -> bool:
    """True when ``candidate`` is this session's token (constant-time comparison)."""
    token = session.get(CSRF_KEY)
    if not isinstance(token, str) or not isinstance(candidate, str) or not candidate:
        return False
    return hmac.compare_digest(token.encode(), candidate.encode("utf-8", "replace"))


def add_headers(response: Response, hsts: bool) -> Response:
    """Set the security headers on ``response``."""
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    if hsts:
        response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    return response


class RateLimiter:
    """Token buckets: ``burst`` requests at once, refilled at ``per_minute`` per minute."""

    #: Buckets kept at most; full (idle) buckets are dropped beyond this.
    MAX_KEYS = 50_000

    def __init__(self, per_minute: float, burst: int) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, cost: float = 1.0) -> float:
        """Take ``cost`` tokens for ``key``: 0.0 if allowed, else seconds to wait."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= cost:
                self._buckets[key] = (tokens - cost, now)
                if len(self._buckets) > self.MAX_KEYS:
                    self._prune(now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (cost - tokens) / self.rate if self.rate > 0 else 3600.0

    def wait(self, key: str, cost: float = 1.0) -> float:
        """Seconds until ``key`` could take ``cost`` tokens (0.0: now); takes nothing."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= cost:
            return 0.0
        return (cost - tokens) / self.rate if self.rate > 0 else 3600.0

    def _prune(self, now: float) -> None:
        full = [
            k
            for k, (tokens, last) in self._buckets.items()
            if tokens + (now - last) * self.rate >= self.burst
        ]
        for key in full:
            del self._buckets[key]


@dataclass(frozen=True)
class Limits:
    """The rate limits of the web UI, one bucket set each."""

    #: Submissions and sign-ups of signed-in users (per user).
    users: RateLimiter
    #: Submissions and sign-ups of visitors who are not signed in (per address).
    anonymous: RateLimiter
    #: Failed logins per (address, account).
    login_pair: RateLimiter
    #: Failed logins per address, over all accounts.
    login_address: RateLimiter
