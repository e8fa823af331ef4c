"""Errors raised by JODL. Each one carries a message fit to show a user as one line."""

from __future__ import annotations


class JodlError(Exception):
    """Base class of every error JODL raises on purpose."""


class ConfigError(JodlError):
    """A setting is missing or has a bad value; the message names the variable."""


class UnknownFamily(JodlError):
    """No family of that name is installed (entry-point group ``jodl.families``)."""


class BadPayload(JodlError):
    """A payload or result is not JSON (or not a JSON object where one is required)."""


class StoreUnavailable(JodlError):
    """The reconstruction log's database cannot be reached."""


class AgentUnavailable(JodlError):
    """An agent could not be reached or refused the call."""


class AuthError(JodlError):
    """A peer failed authentication, or no authentication is configured where one is required."""


class LeaseHeld(JodlError):
    """Another live master holds the lease of this database; this one must not act."""

    def __init__(self, holder: str, seconds_left: float, hint: str = "") -> None:
        super().__init__(
            f"a master ({holder}) is running on this database; only one master acts on it "
            f"(its lease is renewed while it runs: stop it, or take over with --takeover)" + hint
        )
        self.holder = holder
        self.seconds_left = seconds_left


class Fenced(AgentUnavailable):
    """A master with a newer epoch has taken over; this master must stop.

    Raised when the lease was taken, and by the agent client when an agent refuses
    this master's older epoch (for that agent it is also unavailable: code that only
    gives up on the node keeps working; the master's loop stops on it).
    """


class Stopped(JodlError):
    """A master was asked to stop (SIGTERM) before its cycle ended; the run resumes later."""


__all__ = [
    "AgentUnavailable",
    "AuthError",
    "BadPayload",
    "ConfigError",
    "Fenced",
    "JodlError",
    "LeaseHeld",
    "Stopped",
    "StoreUnavailable",
    "UnknownFamily",
]
