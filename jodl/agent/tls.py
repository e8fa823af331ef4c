"""Mutual TLS between masters and agents: contexts, and the role a certificate names.

A private CA signs every certificate. A certificate says which role it may play
through its extended key usage: serverAuth for agents, clientAuth for masters. The
TLS roles always follow the JODL roles, whichever side opened the TCP connection:
an agent is the TLS server (its certificate must name the node's address) and a
master the TLS client, also on the master's registration port where the agent
connects (:mod:`jodl.agent.auth`), so an agent never needs a master's role.
OpenSSL refuses a certificate whose extended key usage names only the other role;
one without any would pass for both, so it is refused here.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from rpyc.utils.authenticators import AuthenticationError  # type: ignore[import-untyped]

from ..settings.config import Settings

_EKU_EXTENSION = b"\x06\x03\x55\x1d\x25"  # OID 2.5.29.37, extKeyUsage
SERVER_AUTH = b"\x2b\x06\x01\x05\x05\x07\x03\x01"  # 1.3.6.1.5.5.7.3.1
CLIENT_AUTH = b"\x2b\x06\x01\x05\x05\x07\x03\x02"  # 1.3.6.1.5.5.7.3.2


def _der_item(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the DER item at ``at``."""
    tag, size = der[at], der[at + 1]
    at += 2
    if size & 0x80:
        count = size & 0x7F
        size = int.from_bytes(der[at : at + count], "big")
        at += count
    if at + size > len(der):
        raise ValueError("truncated DER")
    return tag, at, at + size


def extended_key_usages(der: bytes) -> set[bytes] | None:
    """The extended key usage OIDs (DER values) of a DER certificate; None without any."""
    at = der.find(_EKU_EXTENSION)
    while at >= 0:
        try:
            pos = at + len(_EKU_EXTENSION)
            tag, start, end = _der_item(der, pos)
            if tag == 0x01:  # critical flag
                tag, start, end = _der_item(der, end)
            if tag == 0x04:  # OCTET STRING holding SEQUENCE OF OID
                tag, start, end = _der_item(der, start)
                if tag == 0x30:
                    usages, pos = set(), start
                    while pos < end:
                        tag, value, pos = _der_item(der, pos)
                        if tag != 0x06:
                            raise ValueError("not an OID")
                        usages.add(der[value:pos])
                    return usages
        except (IndexError, ValueError):
            pass
        at = der.find(_EKU_EXTENSION, at + 1)
    return None


def check_role(der: bytes | None, usage: bytes, peer: str) -> None:
    """AuthenticationError unless the peer's certificate names its role ``usage``."""
    usages = extended_key_usages(der or b"")
    role = "serverAuth" if usage == SERVER_AUTH else "clientAuth"
    if usages is None or usage not in usages:
        raise AuthenticationError(
            f"the {peer}'s certificate does not carry the {role} extended key usage "
            "(agents need serverAuth, masters clientAuth)"
        )


def server_context(settings: Settings) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(settings.tls_cert or "", settings.tls_key)
    ctx.load_verify_locations(settings.tls_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the master must show a CA-signed cert
    return ctx


def client_context(settings: Settings) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(settings.tls_cert or "", settings.tls_key)
    ctx.load_verify_locations(settings.tls_ca)
    # The agent's certificate must name the node's address (a DNS name or an IP
    # address in its subject alternative names): a certificate of the CA issued
    # to another node does not pass for this one.
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def tls_handshake(
    ctx: ssl.SSLContext, sock: socket.socket, seconds: float, **kwargs: Any
) -> ssl.SSLSocket:
    """Wrap ``sock`` with ``ctx`` and shake hands within ``seconds`` (as a whole)."""
    tls = ctx.wrap_socket(sock, do_handshake_on_connect=False, **kwargs)
    tls.settimeout(seconds)
    tls.do_handshake()  # bounded as a whole by the socket's timeout
    return tls


__all__ = [
    "CLIENT_AUTH",
    "SERVER_AUTH",
    "check_role",
    "client_context",
    "extended_key_usages",
    "server_context",
    "tls_handshake",
]
