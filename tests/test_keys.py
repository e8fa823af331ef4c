"""Node keys: an agent's key serves its master and says hello for its own node, and
commands no other agent; the secret is rotated while masters and agents run.

Real ``jodl agent`` subprocesses on loopback, a real master, real sockets.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable

import pytest
from agents import AgentProcess, free_port, run_jodl, wait_for
from sqlalchemy import func, select

from jodl import Master, Settings, Store
from jodl.agent.auth import _MAGIC as MAGIC
from jodl.agent.keys import KEY_ID_BYTES, key_id, mac, node_key
from jodl.agent.registry import hello
from jodl.agent.wire import connect, hello_connect
from jodl.exceptions import AgentUnavailable, AuthError
from jodl.log.models import Execution, Node

SECRET = secrets.token_urlsafe(32)
NEW_SECRET = secrets.token_urlsafe(32)


def keyed(address: str, secret: str = SECRET) -> dict[str, str | None]:
    """An agent's environment with its own node key and no cluster secret."""
    return {"JODL_SECRET": None, "JODL_NODE_KEY": node_key(secret, address)}


def spawn_keyed(
    spawn_agent: Callable[..., AgentProcess], secret: str = SECRET, port: int | None = None
) -> AgentProcess:
    port = port or free_port()
    return spawn_agent(env=keyed(f"127.0.0.1:{port}", secret), port=port)


def test_one_agents_key_cannot_command_another_agent(spawn_agent) -> None:
    a, b = spawn_keyed(spawn_agent), spawn_keyed(spawn_agent)
    master = Settings(secret=SECRET, call_timeout=10.0)
    for agent in (a, b):  # the master derives each node's key from its secret
        conn = connect(agent.address, master)
        assert conn.root.ping()[0]
        conn.close()
    stolen = node_key(SECRET, a.address)  # everything agent A's host holds
    # A's key used as if it were the cluster secret: B's key is not derived from it.
    with pytest.raises(AuthError, match="authentication failed"):
        connect(b.address, Settings(secret=stolen, call_timeout=10.0))
    # Nor does a proof under A's key pass, whatever key id the peer claims.
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as sock:
        banner = b""
        while len(banner) < len(MAGIC) + 1 + KEY_ID_BYTES + 32:
            banner += sock.recv(4096)
        assert banner[len(MAGIC) + 1 : len(MAGIC) + 1 + KEY_ID_BYTES] != key_id(stolen)
        nonce, mine = banner[-32:], os.urandom(32)
        sock.sendall(MAGIC + mac(stolen, MAGIC + b"master", nonce, mine) + mine)
        assert sock.recv(4096) == b"", "B closes the connection without a proof of its own"
    conn = connect(b.address, master)
    try:
        assert conn.root.ping()[1] == 0, "B never heard an init"
    finally:
        conn.close()


def test_a_node_key_says_hello_for_its_own_node_only(store: Store, settings: Settings) -> None:
    listen = f"127.0.0.1:{free_port()}"
    master = Master(settings.replace(register_listen=listen, secret=SECRET), store=store)
    master.start()
    mine = Settings(node_key=node_key(SECRET, "127.0.0.1:7001"), call_timeout=10.0)
    try:
        hello(listen, "127.0.0.1:7001", 2, mine)
        with pytest.raises(AgentUnavailable, match="hello"):
            hello(listen, "127.0.0.1:7002", 2, mine)  # the handshake names the address
        conn = hello_connect(listen, "127.0.0.1:7001", mine)
        try:  # authenticated as 7001, the call itself names another node
            with pytest.raises(Exception, match="proved it is 127.0.0.1:7001"):
                conn.root.hello("127.0.0.1:7002", 1, "{}")
        finally:
            conn.close()
    finally:
        master.close()
    assert [n.address for n in store.nodes()] == ["127.0.0.1:7001"]


def test_the_secret_is_rotated_while_the_cluster_runs(
    store: Store, settings: Settings, spawn_agent: Callable[..., AgentProcess]
) -> None:
    """Masters accept the old and the new secret; each agent moves to its new key on its
    own (a restart on the same address); then the old secret is dropped."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    listen = f"127.0.0.1:{free_port()}"
    agent = spawn_agent(env=keyed(address, SECRET), port=port, args=("--register", listen))
    family = store.ensure_family("noop")
    rotating = settings.replace(secret=NEW_SECRET, secret_previous=SECRET, register_listen=listen)
    master = Master(rotating, store=store)
    master.start()
    try:
        wait_for(lambda: store.nodes(), what="the agent's hello under its old key")
        store.add_jobs(family, ((f"a{i}", "{}") for i in range(20)))
        assert master.run_cycle("noop").done == 20
        agent.stop()  # its new key, on the same address
        agent = spawn_agent(env=keyed(address, NEW_SECRET), port=port, args=("--register", listen))
        store.add_jobs(family, ((f"b{i}", "{}") for i in range(20)))
        summary = master.run_cycle("noop")
        assert summary.done == summary.total > 0 and not summary.dead
    finally:
        master.close()
    assert connect(address, Settings(secret=NEW_SECRET, call_timeout=10.0)).root.ping()[0]
    # The old secret dropped: an agent still on its old key is refused, saying what to do.
    agent.stop()
    spawn_agent(env=keyed(address, SECRET), port=port)
    with pytest.raises(AuthError, match=f"jodl node key {address}"):
        connect(address, Settings(secret=NEW_SECRET, call_timeout=10.0))
    assert connect(address, Settings(secret=SECRET, call_timeout=10.0)).root.ping()[0]


def test_an_agent_refuses_a_key_that_is_not_a_node_key(spawn_agent) -> None:
    with pytest.raises(RuntimeError, match="JODL_NODE_KEY is not a node key"):
        spawn_agent(env={"JODL_SECRET": None, "JODL_NODE_KEY": "x" * 40})


def ran_on(store: Store, address: str) -> int:
    """Executions that ended done on the node at ``address``."""
    with store.engine.connect() as conn:
        return conn.scalar(
            select(func.count())
            .select_from(Execution)
            .join(Node, Node.id == Execution.node_id)
            .where(Node.address == address, Execution.state == "done")
        )


def node_row(store: Store, address: str) -> Node:
    return {n.address: n for n in store.nodes()}[address]


def node_state(store: Store, address: str) -> str:
    return node_row(store, address).state


def test_a_rekeyed_nodes_old_key_is_refused_at_once_while_the_cluster_runs(
    store: Store, settings: Settings, spawn_agent: Callable[..., AgentProcess]
) -> None:
    """A host taken over: ``jodl node rekey`` refuses its key at once, the running master
    drops the node without a restart, its hello is refused, the other node serves on,
    and the rebuilt agent with the new key at the same address is taken back."""
    a, b = spawn_keyed(spawn_agent), spawn_keyed(spawn_agent)
    for agent in (a, b):
        store.add_node(agent.address, slots=2)
    family = store.ensure_family("noop")
    listen = f"127.0.0.1:{free_port()}"
    master = Master(
        settings.replace(secret=SECRET, register_listen=listen, node_backoff_max=0.5),
        store=store,
    )
    master.start()
    try:
        store.add_jobs(family, ((f"a{i}", "{}") for i in range(20)))
        assert master.run_cycle("noop").done == 20
        assert store.rekey_node(a.address) == (1, 1)
        master.fleet.refresh(master.epoch, force=True)  # as its loop does within a second
        assert node_state(store, a.address) == "unreachable"
        assert "authentication failed" in (node_row(store, a.address).last_error or "")
        before = ran_on(store, a.address)
        store.add_jobs(family, ((f"b{i}", "{}") for i in range(20)))
        summary = master.run_cycle("noop")
        assert summary.done == summary.total == 40 and not summary.dead  # a cycle runs all
        assert ran_on(store, a.address) == before, "no job went to the revoked key"
        # Everything the host held: its old key says hello for it no more.
        old = Settings(node_key=node_key(SECRET, a.address), call_timeout=10.0)
        with pytest.raises(AgentUnavailable, match="hello"):
            hello(listen, a.address, 2, old)
        # The rebuilt agent, with the key the command printed, is taken back.
        a.stop()
        renewed = {"JODL_SECRET": None, "JODL_NODE_KEY": node_key(SECRET, a.address, 1)}
        a = spawn_agent(env=renewed, port=a.port)
        hello(listen, a.address, 2, Settings(node_key=renewed["JODL_NODE_KEY"], call_timeout=10.0))

        def back() -> bool:
            master.fleet.refresh(master.epoch, force=True)
            return node_state(store, a.address) == "active"

        wait_for(back, what="the rebuilt agent taken back under its new key")
        store.add_jobs(family, ((f"c{i}", "{}") for i in range(20)))
        assert master.run_cycle("noop").done == 60
    finally:
        master.close()


def test_one_nodes_key_rolls_over_without_a_gap(
    store: Store, settings: Settings, spawn_agent: Callable[..., AgentProcess]
) -> None:
    """``rekey --keep-old``: the agent serves on under its old key while the new one is
    put in place; ``--drop-old`` then refuses the old key and keeps the new session."""
    a = spawn_keyed(spawn_agent)
    store.add_node(a.address, slots=2)
    family = store.ensure_family("noop")
    master = Master(settings.replace(secret=SECRET), store=store)
    master.start()
    try:
        (slot,) = master.fleet.slots.values()
        session = slot.link.session
        assert store.rekey_node(a.address, keep_old=True) == (0, 1)
        master.fleet.refresh(master.epoch, force=True)
        assert slot.link.session == session, "the open session rests on a key still accepted"
        store.add_jobs(family, ((f"a{i}", "{}") for i in range(20)))
        assert master.run_cycle("noop").done == 20
        a.stop()  # the agent restarts with its new key
        a = spawn_agent(
            env={"JODL_SECRET": None, "JODL_NODE_KEY": node_key(SECRET, a.address, 1)},
            port=a.port,
        )
        store.add_jobs(family, ((f"b{i}", "{}") for i in range(20)))
        summary = master.run_cycle("noop")
        assert summary.done == summary.total == 40 and not summary.dead
        assert store.drop_old_node_keys(a.address) == (1, 1)
        master.fleet.refresh(master.epoch, force=True)
        assert node_state(store, a.address) == "active"
        store.add_jobs(family, ((f"c{i}", "{}") for i in range(20)))
        assert master.run_cycle("noop").done == 60
        assert ran_on(store, a.address) == 20 + 40 + 60
    finally:
        master.close()
    # The old key is refused now; the new one serves.
    new_only = Settings(secret=SECRET, call_timeout=10.0)
    assert connect(a.address, new_only, generations=(1, 1)).root.ping()[0]
    a.stop()
    a = spawn_agent(env=keyed(a.address), port=a.port)
    with pytest.raises(AuthError, match=f"jodl node key {a.address}"):
        connect(a.address, new_only, generations=(1, 1))


def test_node_rekey_prints_the_key_masters_accept(db_url: str, store: Store) -> None:
    address = "127.0.0.1:7001"
    store.add_node(address)
    env = {"JODL_DATABASE_URL": db_url, "JODL_SECRET": SECRET}

    def jodl(*args: str) -> str:
        done = run_jodl(*args, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert jodl("node", "key", address) == node_key(SECRET, address)
    assert jodl("node", "rekey", address) == node_key(SECRET, address, 1)
    assert store.node_key_range(address) == (1, 1)
    assert jodl("node", "key", address) == node_key(SECRET, address, 1)
    assert jodl("node", "rekey", address, "--keep-old") == node_key(SECRET, address, 2)
    assert store.node_key_range(address) == (1, 2)
    assert jodl("node", "rekey", address, "--drop-old") == node_key(SECRET, address, 2)
    assert store.node_key_range(address) == (2, 2)
    # A node never rekeyed, or unknown, has its first key.
    assert jodl("node", "key", "127.0.0.1:7002") == node_key(SECRET, "127.0.0.1:7002")
    unknown = run_jodl("node", "rekey", "127.0.0.1:7002", env=env)
    assert unknown.returncode == 1 and "no node 127.0.0.1:7002" in unknown.stderr
    assert store.node_key_range("127.0.0.1:7002") == (0, 0)
