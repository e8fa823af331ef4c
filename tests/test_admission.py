"""Admission to the agent's handshake: silent peers cannot keep a master out (issue 20, medium 5).

The policy on its own, then a real ``jodl agent`` subprocess flooded with real silent
connections from other loopback addresses (127.0.0.2, ...; any 127.x.y.z is this
machine), while a master connects from 127.0.0.1.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest
from agents import TEST_SECRET, AgentProcess, wait_for

from jodl.agent.admission import KNOWN_MAX, HandshakeSlots
from jodl.agent.wire import connect
from jodl.settings.config import Settings

# -- the policy ---------------------------------------------------------------------------------


def test_one_address_takes_at_most_its_share() -> None:
    slots = HandshakeSlots(16)
    assert [slots.take("10.0.0.1") for _ in range(6)] == [True] * 4 + [False] * 2
    assert slots.take("10.0.0.2")
    slots.give_back("10.0.0.1")
    assert slots.take("10.0.0.1")


def test_unknown_peers_leave_the_reserved_room_to_known_addresses() -> None:
    slots = HandshakeSlots(16)
    slots.authenticated("10.0.0.9")
    # Strangers from many addresses fill what is not reserved...
    admitted = sum(slots.take(f"10.1.0.{i}") for i in range(40) for _ in range(4))
    assert admitted == 16 - 4
    assert not slots.take("10.2.0.1")
    # ...a known master still gets in.
    assert slots.take("10.0.0.9")


def test_known_addresses_are_bounded() -> None:
    slots = HandshakeSlots(4)
    for i in range(KNOWN_MAX + 1):
        slots.authenticated(f"10.0.{i // 256}.{i % 256}")
    for _ in range(3):  # the unknown room: 4 - 1 reserved
        assert slots.take(f"10.9.0.{_}")
    assert not slots.take("10.0.0.0")  # the oldest was forgotten
    assert slots.take(f"10.0.{KNOWN_MAX // 256}.{KNOWN_MAX % 256}")


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        HandshakeSlots(0)


# -- a real agent, real silent sockets ----------------------------------------------------------

#: The agent's banner: magic, mode and nonce (a held connection receives it at once).
BANNER = len(b"JODL2") + 1 + 32


class Peers:
    """Silent connections to an agent, each from a given loopback address."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.socks: list[socket.socket] = []

    def open(self, address: str, count: int) -> list[socket.socket]:
        new = [
            socket.create_connection(
                ("127.0.0.1", self.port), timeout=10, source_address=(address, 0)
            )
            for _ in range(count)
        ]
        for sock in new:
            sock.setblocking(False)  # looked at, never waited on
        self.socks.extend(new)
        return new

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def sort_out(socks: list[socket.socket]) -> tuple[int, int]:
    """(held, turned away): a held connection gets the agent's banner, a turned-away one
    is closed without a byte. Polled until every connection has shown which."""
    verdicts: dict[int, bool] = {}

    def decided() -> bool:
        for i, sock in enumerate(socks):
            if i in verdicts:
                continue
            try:
                data = sock.recv(BANNER, socket.MSG_DONTWAIT | socket.MSG_PEEK)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            verdicts[i] = bool(data)
        return len(verdicts) == len(socks)

    wait_for(decided, timeout=20, what="the agent to hold or turn away each connection")
    held = sum(verdicts.values())
    return held, len(socks) - held


@pytest.fixture
def flooded(spawn_agent: Callable[..., AgentProcess]) -> Iterator[tuple[AgentProcess, Peers]]:
    # Silent peers keep their slots for the whole test (a minute).
    agent = spawn_agent(env={"JODL_HANDSHAKE_LIMIT": "16", "JODL_HANDSHAKE_TIMEOUT": "60"})
    peers = Peers(agent.port)
    try:
        yield agent, peers
    finally:
        peers.close()


def master_gets_in(agent: AgentProcess) -> bool:
    conn = connect(agent.address, Settings(call_timeout=10.0, secret=TEST_SECRET))
    try:
        return bool(conn.root.ping()[0])
    finally:
        conn.close()


def test_one_peer_with_silent_connections_leaves_room_for_a_master(flooded) -> None:
    agent, peers = flooded
    held, turned_away = sort_out(peers.open("127.0.0.2", 40))
    assert held == 16 // 4 and turned_away == 40 - held
    # A master that never reached this agent before connects all the same.
    assert master_gets_in(agent)


def test_many_silent_addresses_leave_room_for_a_known_master(flooded) -> None:
    agent, peers = flooded
    assert master_gets_in(agent)  # the master's address is known from now on
    socks = [sock for i in range(2, 12) for sock in peers.open(f"127.0.0.{i}", 4)]
    held, _ = sort_out(socks)
    assert held == 16 - 16 // 4  # all the room strangers may have
    (stranger,) = peers.open("127.0.1.1", 1)
    assert sort_out([stranger]) == (0, 1)
    assert master_gets_in(agent)
