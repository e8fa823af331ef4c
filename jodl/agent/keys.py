"""Who holds which key: the cluster secret on masters, one node key per agent.

Masters hold the cluster secret (``JODL_SECRET``). An agent holds only the key of its
own node (``JODL_NODE_KEY``, or ``jodl agent --key-file``), which masters derive from
the secret and the address they call the node at:

    node key = HMAC-SHA256(secret, "JODL node key 1" NUL address)

``jodl node key ADDRESS`` prints it. HMAC-SHA256 is a pseudo-random function: one
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

#: Length of a key id on the wire (bytes): enough to tell a handful of candidates apart.
KEY_ID_BYTES = 8
_NODE_LABEL = b"JODL node key 1\0"
_ID_LABEL = b"JODL key id 1"
_OPS_LABEL = b"JODL ops token 1"


def mac(key: str, label: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under ``key`` of ``label`` and ``parts`` (each fixed-size or last)."""
    return hmac.new(key.encode(), label + b"\0" + b"".join(parts), hashlib.sha256).digest()


def node_key(secret: str, address: str) -> str:
    """The key of the agent masters call at ``address`` (HOST:PORT exactly as they know it)."""
    digest = hmac.new(secret.encode(), _NODE_LABEL + address.encode(), hashlib.sha256).digest()
    return NODE_KEY_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def key_id(key: str) -> bytes:
    """What a peer says to name ``key`` (reveals nothing about it)."""
    return mac(key, _ID_LABEL)[:KEY_ID_BYTES]


def own_key(settings: Settings) -> str | None:
    """The key an agent proves itself with: its node key, else the secret (single-host mode)."""
    return settings.node_key or settings.secret


def keys_for(settings: Settings, address: str) -> dict[bytes, str]:
    """A master's keys for the agent at ``address``, by key id: the node key under the
    secret (and under the previous secret during a rotation), or the secret itself."""
    found: dict[bytes, str] = {}
    for secret in (settings.secret, settings.secret_previous):
        if secret:
            for key in (node_key(secret, address), secret):
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


__all__ = ["KEY_ID_BYTES", "key_id", "keys_for", "mac", "node_key", "own_key", "ops_token"]
