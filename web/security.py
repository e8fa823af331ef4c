"""CSRF tokens, security headers and the submission rate limit of the web UI.

* **CSRF**: one random token per session (in the signed session cookie). Every
  state-changing form carries it in a hidden field; JSON requests authenticated
  by the session cookie carry it in the ``X-CSRF-Token`` header. Requests
  authenticated by HTTP Basic credentials carry no ambient authority and need none.
* **Headers**: a Content-Security-Policy without ``unsafe-inline`` (every script
  and style is a file under ``/static``), no framing, no MIME sniffing, no referrer
  leaks to other sites; HSTS when the session cookie is HTTPS-only.
* **Rate limits**: a moving window per client key (user id, else address), counted
  by the ``limits`` library in the process; enough for one web process, and the
  first line of defence behind a proxy.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass

from flask import Response, session
from limits import RateLimitItemPerSecond
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

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
    """``burst`` requests per ``burst / per_minute`` minutes per key (a moving window).

    The counting is the ``limits`` library's (the engine of Flask-Limiter), in this
    process's memory: enough for one web process, and the first line of defence
    behind a proxy. Views call it where the rule needs it (failed logins only,
    anonymous and signed-in clients apart), which decorators would not express.
    """

    def __init__(self, per_minute: float, burst: int) -> None:
        seconds = max(1, round(60.0 * burst / per_minute)) if per_minute > 0 else 3600
        self.item = RateLimitItemPerSecond(burst, seconds)
        self._window = MovingWindowRateLimiter(MemoryStorage())

    def take(self, key: str, cost: float = 1.0) -> float:
        """Take ``cost`` for ``key``: 0.0 if allowed, else seconds to wait."""
        if self._window.hit(self.item, key, cost=max(1, round(cost))):
            return 0.0
        return self._retry_after(key)

    def wait(self, key: str, cost: float = 1.0) -> float:
        """Seconds until ``key`` could take ``cost`` (0.0: now); takes nothing."""
        if self._window.test(self.item, key, cost=max(1, round(cost))):
            return 0.0
        return self._retry_after(key)

    def _retry_after(self, key: str) -> float:
        reset = self._window.get_window_stats(self.item, key).reset_time
        return max(1.0, reset - time.time())


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
