"""Who holds which key: the cluster secret on masters, one node key per agent.

Masters hold the cluster secret (``JODL_SECRET``). An agent holds only the key of its
own node (``JODL_NODE_KEY``, or ``jodl agent --key-file``), which masters derive from
the secret and the address they call the node at:

    node key = HMAC-SHA256(secret, "JODL node key 1" NUL address [NUL generation])

``jodl node key ADDRESS`` prints it. The *generation* (none: 0) lets one node's key
be replaced alone: ``jodl node rekey ADDRESS`` draws the next one in the log, and
masters accept the node's generations from its oldest accepted one to its newest
(:data:`KeyRange`, read from the node's row), so the old key is refused at once, or
still accepted for a rollover until ``--drop-old``. HMAC-SHA256 is a pseudo-random function: one
node's key tells nothing about the secret or about another node's key, so an agent
host taken over can prove itself as that one node and nothing more. It cannot
command other agents (each asks for proof under its own key), nor say hello for
another address (the master checks the proof under that address's key). See
docs/architecture.md, "Credentials".

An agent given the secret itself (single-host mode: ``jodl up``, one machine) still
works, as every agent did before node keys: it accepts any holder of the secret.

Each key has a *key id* (an HMAC under the key of a fixed label, 8 bytes, which tells
nothing about the key): a peer names the key it holds, so a master picks among its
candidates (the node key under the secret or under ``JODL_SECRET_PREVIOUS`` during a
rotation, or the secret itself) without trying each one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from ..settings.config import NODE_KEY_PREFIX, Settings

#: The generations of a node's key masters accept: (oldest, newest), both included.
KeyRange = tuple[int, int]
#: A node the log has not rekeyed: its one key, of generation 0.
FIRST_KEYS: KeyRange = (0, 0)

#: Length of a key id on the wire (bytes): enough to tell a handful of candidates apart.
KEY_ID_BYTES = 8
_NODE_LABEL = b"JODL node key 1\0"
_ID_LABEL = b"JODL key id 1"
_OPS_LABEL = b"JODL ops token 1"


def mac(key: str, label: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under ``key`` of ``label`` and ``parts`` (each fixed-size or last)."""
    return hmac.new(key.encode(), label + b"\0" + b"".join(parts), hashlib.sha256).digest()


def node_key(secret: str, address: str, generation: int = 0) -> str:
    """The key of the agent masters call at ``address`` (HOST:PORT exactly as they know
    it), of the node's key ``generation``."""
    message = _NODE_LABEL + address.encode()
    if generation:
        message += b"\0%d" % generation
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return NODE_KEY_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def key_id(key: str) -> bytes:
    """What a peer says to name ``key`` (reveals nothing about it)."""
    return mac(key, _ID_LABEL)[:KEY_ID_BYTES]


def own_key(settings: Settings) -> str | None:
    """The key an agent proves itself with: its node key, else the secret (single-host mode)."""
    return settings.node_key or settings.secret


def keys_for(
    settings: Settings, address: str, generations: KeyRange = FIRST_KEYS
) -> dict[bytes, str]:
    """A master's keys for the agent at ``address``, by key id: the node key of each
    accepted generation under the secret (and under the previous secret during a
    rotation), or the secret itself."""
    oldest, newest = generations
    found: dict[bytes, str] = {}
    for secret in (settings.secret, settings.secret_previous):
        if secret:
            keys = [node_key(secret, address, g) for g in range(oldest, newest + 1)]
            for key in (*keys, secret):
                found.setdefault(key_id(key), key)
    return found


def ops_token(settings: Settings) -> str | None:
    """The token of this process's ops endpoint (``/debug/profile``): ``JODL_OPS_TOKEN``,
    else derived from the process's own key. It proves nothing to an agent: holding it
    lets one profile, never act as a master or an agent."""
    if settings.ops_token:
        return settings.ops_token
    key = own_key(settings)
    if not key:
        return None
    return "jodlops1." + base64.urlsafe_b64encode(mac(key, _OPS_LABEL)).rstrip(b"=").decode()


__all__ = [
    "FIRST_KEYS",
    "KEY_ID_BYTES",
    "KeyRange",
    "key_id",
    "keys_for",
    "mac",
    "node_key",
    "own_key",
    "ops_token",
]
