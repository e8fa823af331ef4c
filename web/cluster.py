"""The whole system on one machine (``jodl up``): database, agents, master, scheduler, web.

:class:`LocalCluster` migrates the database, creates an operator account when
there is none, starts agents as child processes on free loopback ports and
registers them as nodes, and runs a serving master (with the on-demand queue
feeder and the page checker's cycle scheduler, which also serves operators'
requests for a cycle now) in a thread of this process.
The web server runs in the main thread (see :mod:`web.commands`).
With ``standalone`` (``jodl up --standalone``) there are no agent processes: one
in-process agent serves the node ``local:1`` (:mod:`web.standalone`).

Agents are watched: one that dies is started again on its port, so the system
keeps its workers (the seed's "spawn workers when too few are alive"), unless its
node was drained: that agent exited because an operator asked (its node is draining
or removed in the log), and is started again only once its node is added back. Agents
end with their parent: they get SIGTERM from :meth:`stop`, and the kernel sends
them one if this process dies without stopping them (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from crawler_app import add_user
from jodl import RunRequests
from jodl.agent import InProcessAgent
from jodl.log import NodeState, Store, make_engine
from jodl.log.migrate import upgrade
from jodl.master import Master
from jodl.queue import Queue, QueueFeeder
from jodl.settings.config import Settings

from . import queries
from .standalone import forget_in_process_nodes, start_in_process

log = logging.getLogger("web.cluster")

#: Agents ``jodl up`` starts.
DEFAULT_AGENTS = 2
#: Seconds an agent has to open its port.
AGENT_START = 30.0
#: Seconds between two checks that the agents are alive.
WATCH_EVERY = 1.0
#: E-mail of the operator account ``jodl up`` creates.
ADMIN_EMAIL = "admin@localhost"
#: Ops endpoint (health, /metrics) of each process ``jodl up`` starts, unless
#: JODL_METRICS_LISTEN / JODL_AGENT_METRICS_LISTEN name one: port 0, a free port each
#: (a fixed default would be shared by the agents), published where Prometheus's
#: service discovery and `jodl status --watch` find it.
OPS_LISTEN = "127.0.0.1:0"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the agent binds (SO_REUSEADDR): a port in TIME_WAIT from the last run is usable.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _load_libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


# Loaded once here: the child between fork and exec must not load libraries.
_LIBC = _load_libc() if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux; elsewhere a no-op)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def restart_wanted(node_state: str | None) -> bool:
    """Whether a dead agent whose node is in ``node_state`` is started again.

    Not when its node drains or was removed: a drained agent exits on purpose, and
    started again it would serve a node no master uses (the master removes a drained
    node once its agent exited). An operator who adds the node back (``jodl node add``,
    the operators' page) makes it active, and the agent is started again.
    """
    return node_state not in (NodeState.DRAINING, NodeState.REMOVED)


@dataclass
class LocalAgent:
    """One agent child process."""

    port: int
    log_path: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    #: Exited with its node drained: left stopped until the node is added back.
    retired: bool = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, env: dict[str, str], wait: bool = True) -> None:
        """Start the process; with ``wait``, return once its port answers."""
        out: Any = subprocess.DEVNULL
        if self.log_path:
            out = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jodl", "agent", "--listen", self.address],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if _LIBC is not None else None,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Return once the agent's port answers; RuntimeError if it exits or takes too long."""
        assert self.proc is not None
        deadline = time.monotonic() + AGENT_START
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"agent {self.address} exited at start (code {self.proc.returncode})"
                )
            if _port_answers(self.port):
                return
            time.sleep(0.05)
        raise RuntimeError(f"agent {self.address} did not open its port in {AGENT_START:.0f}s")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)


@dataclass
class LocalCluster:
    """A master, its agents and the cycle scheduler on one database, in this process tree."""

    database_url: str
    agents: int = DEFAULT_AGENTS
    settings: Settings | None = None
    log_dir: str | None = None
    agent_env: dict[str, str] = field(default_factory=dict)
    #: One process (``jodl up --standalone``): an in-process agent, no agent processes.
    standalone: bool = False
    in_process: InProcessAgent | None = None
    engine: Engine | None = None
    store: Store | None = None
    master: Master | None = None
    children: list[LocalAgent] = field(default_factory=list)
    #: Set when the cluster must stop (Ctrl-C, or the master failed).
    stopping: threading.Event = field(default_factory=threading.Event)
    #: Why the cluster stopped on its own (None: it was asked to).
    failure: str | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _scheduler: Any = None
    _queue: Queue | None = None
    #: The master's ops endpoint (None: off, or not started yet).
    ops: Any = None

    # -- start ----------------------------------------------------------------------------------

    def prepare(self, remembered: tuple[str, str] | None = None) -> tuple[str, str | None]:
        """Migrate the database; create the operator account if there is no operator.

        Returns (admin e-mail, new password or None when an operator existed). An
        operator's ``remembered`` (e-mail, password) from an earlier start is returned
        when it still logs in.
        """
        from crawler_app import check_password

        self.settings = self.settings or Settings.from_env(database_url=self.database_url)
        self.engine = make_engine(self.database_url)
        upgrade(self.engine)
        self.store = Store(self.engine)
        with self.store.session() as s, s.begin():
            admin = queries.first_admin(s)
            if admin is not None:
                if remembered and remembered[0] == admin.email:
                    if check_password(admin, remembered[1]):
                        return admin.email, remembered[1]
                return admin.email, None
            password = secrets.token_urlsafe(12)
            existing = queries.user_by_email(s, ADMIN_EMAIL)
            if existing is not None:
                from crawler_app import set_password

                set_password(existing, password)
                existing.is_admin = True
            else:
                user = add_user(s, ADMIN_EMAIL, password)
                user.is_admin = True
        return ADMIN_EMAIL, password

    def start_agents(self) -> None:
        """Start the agents and register them as nodes."""
        assert self.store is not None and self.settings is not None
        if self.standalone:
            self.in_process = start_in_process(
                self.store, self.settings, self.database_url, self.agent_env
            )
            return
        forget_in_process_nodes(self.store)
        env = dict(os.environ)
        env.update(self.agent_env)
        env.setdefault("JODL_LOG_LEVEL", "WARNING")
        env.setdefault("JODL_AGENT_METRICS_LISTEN", OPS_LISTEN)
        env["JODL_DATABASE_URL"] = self.database_url  # notify claims its digests there
        # All start at once (each takes a moment to import), then each is waited for.
        starting = []
        ports = self._earlier_ports()
        for n in range(self.agents):
            agent = LocalAgent(ports[n] if n < len(ports) else free_port(), self._log_path(n))
            agent.start(env, wait=False)
            starting.append(agent)
        for agent in starting:
            for attempt in range(5):
                try:
                    agent.wait_ready()
                    break
                except RuntimeError:
                    # Most likely the port was taken meanwhile: another one.
                    agent.stop()
                    if attempt == 4:
                        raise
                    agent.port = free_port()
                    agent.start(env, wait=False)
            self.children.append(agent)
            self.store.add_node(agent.address, slots=int(env.get("JODL_AGENT_SLOTS", "4")))
        self._env = env

    def _earlier_ports(self) -> list[int]:
        """Free loopback ports of nodes an earlier start left removed: agents started there
        bring those nodes back (their ids and what was learned) instead of adding new ones."""
        assert self.store is not None
        ports = []
        for node in self.store.nodes(include_removed=True):
            host, _, port = node.address.rpartition(":")
            if node.state == NodeState.REMOVED and host == "127.0.0.1" and port.isdigit():
                if not _port_answers(int(port)) and _bindable(int(port)):
                    ports.append(int(port))
        return ports

    def _log_path(self, n: int) -> str | None:
        if not self.log_dir:
            return None
        return os.path.join(self.log_dir, f"agent-{n + 1}.log")

    def start_master(self) -> None:
        """Start the serving master (queue feeder, cycle scheduler) in a thread."""
        assert self.settings is not None and self.store is not None
        from crawler_app import AppSettings, CycleScheduler, MasterRunner

        # HOST:PID first: a jodl up killed on this host does not hold the lease after it.
        name = f"{socket.gethostname()}:{os.getpid()}:jodl-up"
        settings = self.settings
        if "JODL_METRICS_LISTEN" not in os.environ:
            settings = settings.replace(metrics_listen=OPS_LISTEN)
        master = Master(settings, store=self.store, name=name)
        self._serve_ops(master)
        master.start()
        if not any(isinstance(f, QueueFeeder) for f in master.feeders):
            self._queue = Queue(self.store)
            master.feeders.append(QueueFeeder(self._queue))
        master.feeders.append(RunRequests(self.store))  # `jodl run` beside jodl up
        self.master = master
        self._runner = MasterRunner(master)
        self._scheduler = CycleScheduler(
            self.store.engine, self._runner, AppSettings.from_env(), name=master.name
        )
        self._scheduler.start()
        self._spawn(self._serve, "jodl-master")
        self._spawn(self._watch, "jodl-agent-watch")

    def _serve_ops(self, master: Master) -> None:
        """The master's health and /metrics, on a port of its own (:data:`OPS_LISTEN`)."""
        from jodl.ops.server import serve_master

        self.ops = serve_master(master)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _serve(self) -> None:
        assert self.master is not None
        try:
            self.master.serve(self.stopping)
        except Exception as exc:  # noqa: BLE001 - reported, then everything stops
            log.exception("the master stopped")
            self.failure = f"the master stopped: {exc}"
            self.stopping.set()
        finally:
            try:
                self.master.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the master")
            if self._queue is not None:
                self._queue.close()

    def _watch(self) -> None:
        """Start again any agent that died, on its port (its node keeps what was learned),
        unless its node was drained (:func:`restart_wanted`)."""
        while not self.stopping.wait(WATCH_EVERY):
            dead = [a for a in self.children if not a.alive()]
            if not dead or self.stopping.is_set():
                continue
            assert self.store is not None
            try:
                states = {n.address: n.state for n in self.store.nodes(include_removed=True)}
            except Exception:  # noqa: BLE001 - the database is away: look again next time
                log.exception("reading the nodes' states")
                continue
            for agent in dead:
                if self.stopping.is_set():
                    break
                if not restart_wanted(states.get(agent.address)):
                    if not agent.retired:
                        log.warning(
                            "agent %s exited with its node drained: not started again "
                            "(add the node back to start it)",
                            agent.address,
                        )
                    agent.retired = True
                    continue
                agent.retired = False
                log.warning("agent %s died; starting it again", agent.address)
                agent.restarts += 1
                try:
                    agent.start(self._env)
                except RuntimeError as exc:
                    log.error("%s", exc)

    # -- stop ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the scheduler, the master and the agents; mark the agents' nodes removed."""
        self.stopping.set()
        if self._scheduler is not None:
            self._runner.stopped.set()
            try:
                self._scheduler.stop()
            except Exception:  # noqa: BLE001 - already stopped
                pass
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=15)
        if self.ops is not None:
            self.ops.close()
            self.ops = None
        for agent in self.children:  # all at once: each takes a moment to close
            if agent.alive():
                assert agent.proc is not None
                agent.proc.terminate()
        for agent in self.children:
            agent.stop()
        if self.in_process is not None:
            self.in_process.close()
        if self.store is not None:
            for agent in [*self.children, *([self.in_process] if self.in_process else [])]:
                try:
                    self.store.remove_node(agent.address)
                except Exception:  # noqa: BLE001 - the database may be gone
                    log.exception("marking node %s removed", agent.address)
        if self.engine is not None:
            self.engine.dispose()
