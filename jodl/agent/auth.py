"""Authentication of a connection between a master and an agent, before rpyc speaks.

Two services, each with its own handshake on the raw socket, on every address
(loopback included):

* the **agent's** port, where a master connects (:func:`server_authenticator`,
  :func:`client_handshake`): optional mutual TLS, the agent's banner (whether it
  holds a key, which one by its key id, a nonce), then a mutual HMAC-SHA256
  challenge under that key;
* the **master's registration** port, where an agent says hello
  (:func:`hello_authenticator`, :func:`hello_handshake`): the agent first names
  its address; with TLS the master is the TLS client there too and checks that the
  agent's certificate names that address; then the same challenge under the key
  of that address, so an agent can register itself and no other node.

An agent holds its own node key (or, in single-host mode, the cluster secret);
a master holds the secret and derives each node's key from it
(:mod:`jodl.agent.keys`). Either side proves the key to the other, so a master
never sends jobs to an impostor and an agent obeys only a holder of its key: a
master, never another agent. Every agent requires a key or TLS (it refuses to
start with neither), and a master refuses to connect without one of them.

The handshake also derives the session's frame keys, one per direction, from the
key and both nonces: :class:`jodl.agent.wire.FramedChannel` tags every rpyc frame
with them, so a peer that relayed the handshake without the key can neither
inject, alter, reorder nor replay a frame. With TLS alone, TLS binds the session.
"""

from __future__ import annotations

import hmac
import os
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any

from rpyc.utils.authenticators import AuthenticationError  # type: ignore[import-untyped]

from ..exceptions import AuthError, ConfigError
from ..settings.config import Settings, check_node_key, check_secret
from .keys import FIRST_KEYS, KEY_ID_BYTES, KeyRange, key_id, keys_for, mac, own_key
from .tls import (
    CLIENT_AUTH,
    SERVER_AUTH,
    check_role,
    client_context,
    server_context,
    tls_handshake,
)

#: Bumped on any incompatible change of the handshake or the calls (see :mod:`jodl.agent`).
PROTOCOL_VERSION = 5
_MAGIC = b"JODL%d" % PROTOCOL_VERSION
_NONCE_BYTES = 32
_PROOF_BYTES = 32
#: Where the authenticator hands the session's frame keys to the server (never logged).
_KEYS = "_frame_keys"
#: Banner flags: the agent (or master) requires a key, or relies on TLS alone.
_KEYED, _TLS_ONLY = b"S", b"T"
#: Longest address an agent may name in a hello (bytes).
MAX_ADDRESS = 300
_LENGTH = struct.Struct("!H")

#: (send, receive) frame keys of one side of a session.
SessionKeys = tuple[bytes, bytes]


# --- sockets -----------------------------------------------------------------------------


class _Deadline:
    """One deadline for a whole handshake: every socket operation gets what is left of it.

    A per-operation timeout alone lets a peer that drips a byte now and then hold a
    thread for as long as it likes.
    """

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the handshake took too long")
        return left

    def arm(self, sock: socket.socket) -> None:
        sock.settimeout(self.left())


def _recv_exact(sock: socket.socket, size: int, deadline: _Deadline) -> bytes:
    data = b""
    while len(data) < size:
        deadline.arm(sock)
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise AuthenticationError("peer closed the connection during the handshake")
        data += chunk
    return data


def _send_all(sock: socket.socket, data: bytes, deadline: _Deadline) -> None:
    deadline.arm(sock)
    sock.sendall(data)


def _expect_magic(sock: socket.socket, deadline: _Deadline) -> None:
    # The magic first: a peer that does not speak JODL is dropped at once instead of
    # holding this thread until the handshake's deadline.
    if _recv_exact(sock, len(_MAGIC), deadline) != _MAGIC:
        raise AuthenticationError("protocol mismatch")


# --- proofs --------------------------------------------------------------------------------
#
# Each service has its own labels, so no proof or frame of one can stand for one of the
# other: the agent's port (a master proves "master", the agent "agent") and the
# registration port (the agent proves "hello ADDRESS", the master "registry ADDRESS").


def _proof(key: str, label: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return mac(key, _MAGIC + label, server_nonce, client_nonce)


def _session_keys(
    key: str, service: bytes, server_nonce: bytes, client_nonce: bytes
) -> tuple[bytes, bytes]:
    """(server-to-client, client-to-server) frame keys of a session of ``service``: the
    server's (send, receive); the client's are the other way round."""
    return (
        _proof(key, service + b" frames server->client", server_nonce, client_nonce),
        _proof(key, service + b" frames client->server", server_nonce, client_nonce),
    )


def require_auth(settings: Settings, what: str, agent: bool = False) -> None:
    """:class:`AuthError` (one line) unless ``settings`` authenticate peers: a key or TLS.

    ``agent``: the process is an agent, whose key is its node key (or the secret).
    """
    key = own_key(settings) if agent else settings.secret
    if not (key or settings.tls):
        hint = (
            "set JODL_NODE_KEY (print it on a master host: jodl node key ADDRESS) or JODL_SECRET"
            if agent
            else "set JODL_SECRET (the same on every master; "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
        raise AuthError(f"{what} without authentication: {hint}, or JODL_TLS_CERT/KEY/CA")
    try:
        check_secret(settings.secret)
        check_node_key(settings.node_key)
    except ConfigError as exc:
        raise AuthError(str(exc)) from None


# --- the agent's port: a master connects ------------------------------------------------------


def server_authenticator(settings: Settings) -> Callable[[socket.socket], tuple[Any, Any]]:
    """The agent's rpyc authenticator for ``settings``.

    Every connection starts with the agent's banner (magic, whether a key is
    required and its id, a nonce), so a master learns at once and for sure what the
    agent expects: a master without the key fails with a clear :class:`AuthError`
    instead of a timeout. The whole handshake has one deadline
    (``JODL_HANDSHAKE_TIMEOUT``).
    """
    require_auth(settings, "refusing to serve", agent=True)
    tls = server_context(settings) if settings.tls else None
    key = own_key(settings)
    kid = key_id(key) if key else bytes(KEY_ID_BYTES)
    timeout = settings.handshake_timeout

    def authenticate(sock: socket.socket) -> tuple[Any, Any]:
        deadline = _Deadline(timeout)
        credentials: dict[str, Any] = {}
        try:
            if tls is not None:
                tls_sock = tls_handshake(tls, sock, deadline.left(), server_side=True)
                sock = tls_sock
                check_role(tls_sock.getpeercert(binary_form=True), CLIENT_AUTH, "master")
                credentials["cert"] = tls_sock.getpeercert()
            nonce = os.urandom(_NONCE_BYTES)
            _send_all(sock, _MAGIC + (_KEYED if key else _TLS_ONLY) + kid + nonce, deadline)
            if key:
                _expect_magic(sock, deadline)
                answer = _recv_exact(sock, _PROOF_BYTES + _NONCE_BYTES, deadline)
                proof, master_nonce = answer[:_PROOF_BYTES], answer[_PROOF_BYTES:]
                if not _same(proof, _proof(key, b"master", nonce, master_nonce)):
                    raise AuthenticationError("bad key")
                _send_all(sock, _proof(key, b"agent", nonce, master_nonce), deadline)
                credentials["secret"] = True
                # (send, receive) of the agent, the server here
                credentials[_KEYS] = _session_keys(key, b"agent", nonce, master_nonce)
        except (OSError, ssl.SSLError) as exc:
            raise AuthenticationError(f"handshake failed: {exc}") from None
        sock.settimeout(None)
        return sock, credentials

    return authenticate


def client_handshake(
    sock: socket.socket, settings: Settings, address: str, generations: KeyRange = FIRST_KEYS
) -> tuple[socket.socket, SessionKeys | None]:
    """Run the master's side of the handshake with the agent at ``address`` (HOST:PORT),
    whose node key is of one of ``generations``.

    Returns the socket to use (TLS-wrapped or not) and the session's frame keys
    (master-to-agent, agent-to-master), None with TLS alone.
    """
    host = address.rpartition(":")[0].strip("[]") or address
    # A hung agent accepts connections (the kernel does) but never greets: it must not
    # hold the master's single thread longer than any other call would.
    deadline = _Deadline(min(settings.handshake_timeout, settings.call_timeout))
    try:
        if settings.tls:
            ctx = client_context(settings)
            tls_sock = tls_handshake(ctx, sock, deadline.left(), server_hostname=host)
            sock = tls_sock
            _peer_role(tls_sock, SERVER_AUTH, "agent", address)
        # With TLS 1.3 a refused client certificate only shows on this first read.
        banner = _recv_exact(sock, len(_MAGIC) + 1 + KEY_ID_BYTES + _NONCE_BYTES, deadline)
        if banner[: len(_MAGIC)] != _MAGIC:
            raise AuthError(f"{address}: not a JODL agent of protocol {PROTOCOL_VERSION}")
        at = len(_MAGIC)
        mode, kid = banner[at : at + 1], banner[at + 1 : at + 1 + KEY_ID_BYTES]
        nonce = banner[at + 1 + KEY_ID_BYTES :]
        keys: SessionKeys | None = None
        if mode == _KEYED:
            key = _key_of(settings, address, generations, kid, "the agent")
            my_nonce = os.urandom(_NONCE_BYTES)
            _send_all(sock, _MAGIC + _proof(key, b"master", nonce, my_nonce) + my_nonce, deadline)
            answer = _recv_exact(sock, _PROOF_BYTES, deadline)
            if not _same(answer, _proof(key, b"agent", nonce, my_nonce)):
                raise AuthError(f"{address}: the agent does not know its key")
            from_agent, from_master = _session_keys(key, b"agent", nonce, my_nonce)
            keys = (from_master, from_agent)  # (send, receive) of the master
        elif settings.secret:  # an agent that relies on TLS alone
            raise AuthError(
                f"{address}: the agent has no key and cannot prove who it is; "
                f"give it JODL_NODE_KEY (jodl node key {address})"
            )
    except AuthenticationError as exc:
        raise AuthError(
            f"{address}: authentication failed ({exc}); check {_hint(settings)}"
        ) from None
    except ssl.SSLError as exc:
        detail = getattr(exc, "verify_message", None) or exc.reason or exc
        raise AuthError(f"{address}: TLS handshake failed ({detail}); check JODL_TLS_*") from None
    except (ConnectionResetError, BrokenPipeError) as exc:
        raise AuthError(
            f"{address}: the agent closed the connection during the handshake ({exc}); "
            f"check {_hint(settings)}"
        ) from None
    sock.settimeout(None)
    return sock, keys


# --- the master's registration port: an agent says hello ------------------------------------


def hello_authenticator(
    settings: Settings, generations: Callable[[str], KeyRange] | None = None
) -> Callable[[socket.socket], tuple[Any, Any]]:
    """The master's rpyc authenticator of its registration port.

    The agent names its address first; the credentials handed to the service carry
    it (``address``) once the agent proved the key of that address (or, with TLS,
    showed a certificate naming it). ``generations``: the node key generations
    accepted for an address (the log's; default: the first only).
    """
    require_auth(settings, "refusing to accept hellos")
    tls = client_context(settings) if settings.tls else None
    timeout = settings.handshake_timeout

    def authenticate(sock: socket.socket) -> tuple[Any, Any]:
        deadline = _Deadline(timeout)
        try:
            _expect_magic(sock, deadline)
            (size,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size, deadline))
            if not 0 < size <= MAX_ADDRESS:
                raise AuthenticationError("bad address length")
            address = _recv_exact(sock, size, deadline).decode("ascii", "strict")
            host = address.rpartition(":")[0].strip("[]")
            if not host:
                raise AuthenticationError("the agent named no HOST:PORT")
            credentials: dict[str, Any] = {"address": address}
            if tls is not None:  # the master is the TLS client: the agent's cert names it
                tls_sock = tls_handshake(tls, sock, deadline.left(), server_hostname=host)
                sock = tls_sock
                check_role(tls_sock.getpeercert(binary_form=True), SERVER_AUTH, "agent")
            nonce = os.urandom(_NONCE_BYTES)
            _send_all(sock, _MAGIC + (_KEYED if settings.secret else _TLS_ONLY) + nonce, deadline)
            if settings.secret:
                _expect_magic(sock, deadline)
                answer = _recv_exact(sock, KEY_ID_BYTES + _PROOF_BYTES + _NONCE_BYTES, deadline)
                kid, proof = answer[:KEY_ID_BYTES], answer[KEY_ID_BYTES:-_NONCE_BYTES]
                agent_nonce = answer[-_NONCE_BYTES:]
                accepted = generations(address) if generations else FIRST_KEYS
                key = keys_for(settings, address, accepted).get(kid)
                label = address.encode()
                if key is None or not _same(
                    proof, _proof(key, b"hello " + label, nonce, agent_nonce)
                ):
                    raise AuthenticationError(f"bad key for {address}")
                _send_all(sock, _proof(key, b"registry " + label, nonce, agent_nonce), deadline)
                # (send, receive) of the master, the server here
                credentials[_KEYS] = _session_keys(key, b"hello", nonce, agent_nonce)
        except (OSError, ssl.SSLError, UnicodeError, struct.error) as exc:
            raise AuthenticationError(f"handshake failed: {exc}") from None
        sock.settimeout(None)
        return sock, credentials

    return authenticate


def hello_handshake(
    sock: socket.socket, settings: Settings, address: str, master: str
) -> tuple[socket.socket, SessionKeys | None]:
    """The agent's side of a hello to the master at ``master``, as the node at ``address``.

    Returns the socket (TLS-wrapped or not) and the frame keys (agent-to-master,
    master-to-agent), None with TLS alone.
    """
    require_auth(settings, f"refusing to say hello to {master}", agent=True)
    key = own_key(settings)
    deadline = _Deadline(min(settings.handshake_timeout, settings.call_timeout))
    name = address.encode("ascii")
    try:
        _send_all(sock, _MAGIC + _LENGTH.pack(len(name)) + name, deadline)
        if settings.tls:  # the agent is the TLS server: the master shows a client cert
            tls_sock = tls_handshake(
                server_context(settings), sock, deadline.left(), server_side=True
            )
            sock = tls_sock
            _peer_role(tls_sock, CLIENT_AUTH, "master", master)
        banner = _recv_exact(sock, len(_MAGIC) + 1 + _NONCE_BYTES, deadline)
        if banner[: len(_MAGIC)] != _MAGIC:
            raise AuthError(f"{master}: not a JODL master of protocol {PROTOCOL_VERSION}")
        mode, nonce = banner[len(_MAGIC) : len(_MAGIC) + 1], banner[len(_MAGIC) + 1 :]
        if mode == _KEYED and not key:
            raise AuthError(f"{master}: the master requires a key; set JODL_NODE_KEY")
        if mode != _KEYED and key:
            raise AuthError(f"{master}: the master has no secret and cannot prove who it is")
        keys: SessionKeys | None = None
        if key:
            my_nonce = os.urandom(_NONCE_BYTES)
            proof = _proof(key, b"hello " + name, nonce, my_nonce)
            _send_all(sock, _MAGIC + key_id(key) + proof + my_nonce, deadline)
            answer = _recv_exact(sock, _PROOF_BYTES, deadline)
            if not _same(answer, _proof(key, b"registry " + name, nonce, my_nonce)):
                raise AuthError(f"{master}: the master does not know this node's key")
            from_master, from_agent = _session_keys(key, b"hello", nonce, my_nonce)
            keys = (from_agent, from_master)  # (send, receive) of the agent
    except AuthenticationError as exc:
        raise AuthError(
            f"{master}: the hello was refused ({exc}); its key must be the one "
            f"`jodl node key {address}` prints with the masters' JODL_SECRET"
        ) from None
    except ssl.SSLError as exc:
        detail = getattr(exc, "verify_message", None) or exc.reason or exc
        raise AuthError(f"{master}: TLS handshake failed ({detail}); check JODL_TLS_*") from None
    except (ConnectionResetError, BrokenPipeError) as exc:
        raise AuthError(
            f"{master}: the master closed the connection during the hello ({exc}): "
            f"it does not know the key of {address}; check JODL_NODE_KEY and --advertise"
        ) from None
    sock.settimeout(None)
    return sock, keys


# --- helpers -----------------------------------------------------------------------------------


def _same(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


def _key_of(settings: Settings, address: str, generations: KeyRange, kid: bytes, peer: str) -> str:
    """The master's key for ``address`` whose id is ``kid``; :class:`AuthError` if none."""
    candidates = keys_for(settings, address, generations)
    if not candidates:
        raise AuthError(f"{address}: {peer} requires a key; set JODL_SECRET")
    key = candidates.get(kid)
    if key is None:
        previous = " (or JODL_SECRET_PREVIOUS)" if settings.secret_previous else ""
        raise AuthError(
            f"{address}: authentication failed: {peer}'s key is neither the node key of "
            f"{address} nor the secret "
            f"under this master's JODL_SECRET{previous}: give it the key "
            f"`jodl node key {address}` prints"
        )
    return key


def _peer_role(tls_sock: ssl.SSLSocket, usage: bytes, peer: str, where: str) -> None:
    try:
        check_role(tls_sock.getpeercert(binary_form=True), usage, peer)
    except AuthenticationError as exc:
        raise AuthError(f"{where}: {exc}; check JODL_TLS_*") from None


def _hint(settings: Settings) -> str:
    keys = "JODL_SECRET and the agent's JODL_NODE_KEY"
    return f"{keys} and JODL_TLS_* (certificate role and name)" if settings.tls else keys
