"""The agent's protocol (see jodl/agent/__init__.py), call by call, against a real agent subprocess.

The ``flaky`` example family with ``times: 0`` never fails and returns how many
times its key ran on this agent: a run counter the tests read back.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
from agents import TEST_SECRET, AgentProcess, port_answers, spawn_jodl, wait_for

from jodl.agent.client import AgentLink
from jodl.agent.codec import decode_done, decode_failed, encode_ids, encode_jobs
from jodl.agent.core import QUICK_JOB, AgentCore
from jodl.agent.replies import check_families
from jodl.agent.wire import connect
from jodl.family import Family
from jodl.settings.config import Settings

EPOCH = 1


class Client:
    """The master's side of one agent connection, as the tests drive it."""

    def __init__(self, agent: AgentProcess) -> None:
        self.conn = connect(agent.address, Settings(call_timeout=10.0, secret=TEST_SECRET))
        self.root = self.conn.root
        self.epoch = EPOCH
        info = json.loads(self.root.init("test-master", self.epoch, "{}"))
        self.slots = info["slots"]

    def send(self, *jobs: tuple[int, str, dict[str, Any]]) -> tuple[tuple[int, str], ...]:
        wire = tuple((eid, fam, json.dumps(payload)) for eid, fam, payload in jobs)
        return self.root.send(self.epoch, wire)

    def done(self, ack: tuple[int, ...] = ()) -> dict[int, Any]:
        return {
            eid: json.loads(result)
            for eid, _duration, _finished, result in self.root.done(self.epoch, ack, 1000)
        }

    def failed(self, ack: tuple[int, ...] = ()) -> dict[int, tuple[str, bool]]:
        return {
            eid: (error, retryable)
            for eid, _d, _f, error, retryable in self.root.failed(self.epoch, ack, 1000)
        }

    def remaining(self) -> tuple[int, int, int, int]:
        return tuple(self.root.remaining(self.epoch))  # type: ignore[return-value]

    def wait_done(self, *ids: int) -> dict[int, Any]:
        wait_for(lambda: set(ids) <= set(self.done()), timeout=20, what=f"results of {ids}")
        return self.done()

    def wait_idle(self) -> None:
        wait_for(lambda: self.remaining()[:2] == (0, 0), timeout=20, what="an idle agent")

    def close(self) -> None:
        self.conn.close()


def counter(key: str) -> dict[str, Any]:
    return {"key": key, "times": 0}


@pytest.fixture
def agent(spawn_agent: Callable[..., AgentProcess]) -> AgentProcess:
    return spawn_agent(env={"JODL_AGENT_SLOTS": "1"})


@pytest.fixture
def client(agent: AgentProcess) -> Iterator[Client]:
    c = Client(agent)
    yield c
    c.close()


def test_ping_and_families(client):
    name, epoch, now = client.root.ping()
    assert epoch == EPOCH and now > 0 and name
    families = {f.name: f for f in check_families(client.root.families())}
    assert {"noop", "sleep", "fail", "flaky"} <= set(families)
    # Each family carries its version and flags (the master compares versions).
    assert families["noop"].version == "1" and families["noop"].idempotent
    assert not families["mark"].idempotent and not families["mark"].is_async
    assert families["asleep"].is_async


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_async_families_run_on_the_chosen_event_loop(spawn_agent, loop):
    agent = spawn_agent(env={"JODL_AGENT_LOOP": loop})
    client = Client(agent)
    try:
        info = json.loads(client.root.init("test-master", EPOCH, "{}"))
        assert info["event_loop"] == loop
        client.send((1, "asleep", {"seconds": 0.01}), (2, "asleep", {}))
        assert client.wait_done(1, 2) == {1: {"loop": loop}, 2: {"loop": loop}}
    finally:
        client.close()


def test_send_is_idempotent_by_execution_id(client):
    # The same id twice in one batch, again in a second batch, and again after the ack:
    # a send that timed out on the master and was repeated must not run twice.
    assert client.send((1, "flaky", counter("a")), (1, "flaky", counter("a"))) == ()
    assert client.send((1, "flaky", counter("a"))) == ()
    assert client.wait_done(1) == {1: {"attempt": 1}}
    assert client.send((1, "flaky", counter("a"))) == ()
    assert client.done(ack=(1,)) == {}
    client.send((1, "flaky", counter("a")))
    client.send((2, "flaky", counter("a")))
    assert client.wait_done(2) == {2: {"attempt": 2}}, "exec 1 ran exactly once"


def test_results_are_held_until_acknowledged(client):
    client.send((10, "noop", {}), (11, "noop", {}))
    assert set(client.wait_done(10, 11)) == {10, 11}
    assert set(client.done()) == {10, 11}, "asking again without an ack returns them again"
    assert client.remaining() == (0, 0, 2, 0)
    assert set(client.done(ack=(10,))) == {11}, "the ack is applied before the answer"
    assert client.root.ack(client.epoch, (11,)) == 1
    assert client.done() == {}
    assert client.remaining() == (0, 0, 0, 0)


def test_a_session_is_handed_each_outcome_once_until_it_reconnects(agent):
    """A master's session (its calls name it) gets each held outcome once, by every way
    of collecting; the outcomes stay held until acknowledged, and the next session of
    the master (after a failed call it connects again) gets those not acknowledged."""
    link = AgentLink(1, agent.address, Settings(call_timeout=10.0, secret=TEST_SECRET))
    link.open("test-master", EPOCH)
    link.send(EPOCH, ((30, "noop", "{}"), (31, "fail", '{"permanent": true}')))
    wait_for(lambda: link.remaining(EPOCH)[2:] == (1, 1), timeout=20, what="two outcomes")
    done, failed = link.outcomes(EPOCH, (), 10)
    assert [r.exec_id for r in done] == [30] and [r.exec_id for r in failed] == [31]
    assert link.outcomes(EPOCH, (), 10) == ([], [])
    assert link.done(EPOCH, (), 10) == [] and link.failed(EPOCH, (), 10) == []
    link.send(EPOCH, ((32, "noop", "{}"),))
    wait_for(lambda: link.remaining(EPOCH)[2] == 2, timeout=20, what="a third outcome")
    refused, done, failed = link.exchange(EPOCH, (), (30,), 10)
    assert [r.exec_id for r in done] == [32] and failed == []
    assert link.remaining(EPOCH)[2:] == (1, 1), "held until acknowledged"
    link.close()
    link.open("test-master", EPOCH)
    done, failed = link.outcomes(EPOCH, (), 10)
    assert [r.exec_id for r in done] == [32] and [r.exec_id for r in failed] == [31]
    assert link.outcomes(EPOCH, (32, 31), 10) == ([], [])
    assert link.remaining(EPOCH) == (0, 0, 0, 0)
    link.close()


def test_failures_are_reported_with_retryability(client):
    client.send((20, "fail", {"message": "boom"}), (21, "fail", {"permanent": True}))
    wait_for(lambda: len(client.failed()) == 2, timeout=20, what="two failures")
    failed = client.failed(ack=())
    assert failed[20][1] is True and "boom" in failed[20][0]
    assert failed[21][1] is False
    assert client.failed(ack=(20, 21)) == {}


def test_unknown_family_is_refused_at_send(client):
    refused = dict(client.send((30, "no-such-family", {}), (31, "noop", {})))
    assert list(refused) == [30]
    assert "unknown family" in refused[30]
    assert set(client.wait_done(31)) == {31}


def test_take_back_returns_only_unstarted_jobs(client):
    assert client.slots == 1
    client.send((40, "sleep", {"seconds": 1.5}), (41, "noop", {}), (42, "noop", {}))
    wait_for(lambda: client.remaining()[1] == 1, timeout=20, what="the sleep job to start")
    client.send((43, "noop", {}))
    assert sorted(client.root.take_back(client.epoch, 0, (40, 41, 42))) == [41, 42]
    assert client.root.take_back(client.epoch, 5, ()) == (43,), "the last queued, by count"
    assert client.remaining() == (0, 1, 0, 0)
    # Taken-back ids never run here, even if a late duplicate send arrives.
    client.send((41, "noop", {}))
    assert client.remaining()[0] == 0
    assert client.root.cancel(client.epoch, (40,)) == (40,)
    client.wait_idle()
    assert client.done() == {}


def test_cancel_drops_queued_jobs_and_discards_running_ones(client):
    client.send((50, "sleep", {"seconds": 0.5}), (51, "flaky", counter("c")))
    wait_for(lambda: client.remaining()[1] == 1, timeout=20, what="the sleep job to start")
    assert client.root.cancel(client.epoch, (50, 51, 52)) == (50, 51)
    client.wait_idle()
    assert client.done() == {} and client.failed() == {}
    assert client.root.held(client.epoch, (50, 51)) == ()
    client.send((53, "flaky", counter("c")))
    assert client.wait_done(53) == {53: {"attempt": 1}}, "the cancelled queued job never ran"


@pytest.mark.parametrize("family", ["sleep", "asleep"])
def test_a_cancelled_running_job_stops_early_and_frees_its_slot(client, family):
    """A job of a minute, cancelled while it runs, ends long before its minute: a sync
    one hears it (jodl.family.wait_cancelled), an async one has its task cancelled."""
    client.send((80, family, {"seconds": 60.0}))
    wait_for(lambda: client.remaining()[1] == 1, timeout=20, what="the long job to start")
    assert client.root.cancel(client.epoch, (80,)) == (80,)
    client.wait_idle()  # within 20 s, a third of the job's minute
    assert client.done() == {} and client.failed() == {}, "a cancelled job's outcome is dropped"
    client.send((81, "flaky", counter("d")))
    assert client.wait_done(81) == {81: {"attempt": 1}}, "the slot runs other work"


def test_held_lists_what_the_agent_still_knows(client):
    client.send((60, "sleep", {"seconds": 0.2}), (61, "noop", {}))
    assert sorted(client.root.held(client.epoch, (60, 61, 62))) == [60, 61]
    client.wait_done(60, 61)
    assert sorted(client.root.held(client.epoch, (60, 61, 62))) == [60, 61]
    client.done(ack=(60,))
    assert client.root.held(client.epoch, (60, 61, 62)) == (61,)


def test_remaining_counts_queued_running_and_held(client):
    client.send((70, "sleep", {"seconds": 1.0}), (71, "noop", {}), (72, "fail", {}))
    wait_for(lambda: client.remaining()[1] == 1, timeout=20, what="the sleep job to start")
    assert client.remaining() == (2, 1, 0, 0)
    client.wait_idle()
    assert client.remaining() == (0, 0, 2, 1)


def test_an_older_epoch_is_fenced_after_a_newer_init(agent, client):
    client.send((80, "noop", {}))
    newer = Client.__new__(Client)
    newer.conn = connect(agent.address, Settings(call_timeout=10.0, secret=TEST_SECRET))
    newer.root, newer.epoch = newer.conn.root, EPOCH + 1
    try:
        newer.root.init("newer-master", newer.epoch, "{}")
        for call in (
            lambda: client.send((81, "noop", {})),
            lambda: client.done(),
            lambda: client.root.remaining(EPOCH),
            lambda: client.root.ack(EPOCH, (80,)),
            lambda: client.root.take_back(EPOCH, 1, ()),
            lambda: client.root.held(EPOCH, (80,)),
            lambda: client.root.init("old-master", EPOCH, "{}"),
        ):
            with pytest.raises(Exception, match="fenced"):
                call()
        assert client.root.ping()[1] == EPOCH + 1
        # The newer master finds the older one's work and collects it.
        assert newer.root.held(newer.epoch, (80, 81)) == (80,)
        assert set(newer.wait_done(80)) == {80}
    finally:
        newer.close()


def test_framed_batches_carry_the_same_calls(client):
    # The master's hot path: one str per call instead of tuples of tuples.
    jobs = encode_jobs([(90, "noop", "{}"), (91, "flaky", '{\n "key": "f", "times": 0}')])
    assert client.root.send(client.epoch, jobs) == ()
    wait_for(lambda: len(client.done()) == 2, timeout=20, what="two results")
    framed = client.root.done(client.epoch, "", 100, True)
    assert type(framed) is str
    results = {eid: json.loads(result) for eid, _d, _f, result in decode_done(framed)}
    assert results == {90: None, 91: {"attempt": 1}}
    assert client.root.done(client.epoch, encode_ids([90, 91]), 100, True) == ""
    client.root.send(client.epoch, encode_jobs([(92, "fail", '{"permanent": true}')]))
    wait_for(lambda: client.failed(), timeout=20, what="a failure")
    ((eid, _d, _f, error, retryable),) = decode_failed(
        client.root.failed(client.epoch, "", 100, True)
    )
    assert (eid, retryable) == (92, False) and "Permanent" in error


def test_outcomes_answers_done_and_failed_in_one_call(client):
    # Both kinds while jobs are in flight, the ack applied first, each up to the limit.
    client.send((94, "noop", {}), (95, "noop", {}), (96, "fail", {"permanent": True}))
    wait_for(lambda: client.remaining()[2:] == (2, 1), timeout=20, what="two results, a failure")
    done, failed = client.root.outcomes(client.epoch, encode_ids([94]), 100)
    assert [row[0] for row in decode_done(done)] == [95], "the acked result is gone"
    ((eid, _d, _f, error, retryable),) = decode_failed(failed)
    assert (eid, retryable) == (96, False) and "Permanent" in error
    done, failed = client.root.outcomes(client.epoch, encode_ids([95, 96]), 100)
    assert (done, failed) == ("", "")
    assert client.remaining() == (0, 0, 0, 0)


def test_exchange_sends_then_answers_outcomes_in_one_call(client):
    # The jobs queue first; the outcomes held then come back, the ack applied first.
    client.send((97, "noop", {}), (98, "fail", {"permanent": True}))
    wait_for(lambda: client.remaining()[2:] == (1, 1), timeout=20, what="a result, a failure")
    jobs = encode_jobs([(99, "noop", "{}"), (97, "noop", "{}")])
    refused, done, failed = client.root.exchange(client.epoch, jobs, encode_ids([]), 100)
    assert [eid for eid, _reason in refused] == [] and "" not in (done, failed)
    assert [row[0] for row in decode_done(done)] == [97]
    assert [row[0] for row in decode_failed(failed)] == [98]
    # 97 is held until acknowledged, beside the exchanged job's result.
    wait_for(lambda: client.remaining()[2] == 2, timeout=20, what="the exchanged job's result")
    refused, done, failed = client.root.exchange(client.epoch, "", encode_ids([97, 98]), 100)
    assert (refused, [row[0] for row in decode_done(done)], failed) == ((), [99], "")


@pytest.mark.parametrize("frame", ["not-a-number\tnoop\t{}\n", "93\tnoop\n", "1,x"])
def test_a_malformed_frame_is_refused_and_queues_nothing(client, frame):
    with pytest.raises(ValueError):
        if "\t" in frame:
            client.root.send(client.epoch, frame)
        else:
            client.root.held(client.epoch, frame)
    assert client.remaining() == (0, 0, 0, 0)


def test_an_agent_listens_on_ipv6_loopback_and_stops_on_sigterm(tmp_path):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    agent = spawn_jodl("agent", "--listen", f"[::1]:{port}", log_path=tmp_path / "agent6.log")
    try:
        wait_for(lambda: port_answers(port, "::1"), timeout=30, what="the IPv6 agent")
        conn = connect(f"[::1]:{port}", Settings(call_timeout=10.0, secret=TEST_SECRET))
        assert conn.root.ping()[0]
        conn.close()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, (tmp_path / "agent6.log").read_text()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


# -- chunks of quick jobs (in-process agent core) -------------------------------------------


class Quick(Family):
    """A no-op job, or one that sleeps ``payload["sleep"]``; each start is recorded."""

    name = "quick"
    started: ClassVar[list[int]] = []
    #: Set to let the jobs with ``payload["hold"]`` end.
    release: ClassVar[threading.Event] = threading.Event()

    def run(self, payload: dict[str, Any]) -> Any:
        Quick.started.append(payload["n"])
        time.sleep(payload.get("sleep", 0.0))
        if payload.get("hold"):
            Quick.release.wait(10)
        return None


def quick_core(detach: float) -> tuple[AgentCore, Any]:
    """One slot running ``quick`` jobs in chunks, its master's session resumed."""
    Quick.started.clear()
    core = AgentCore("chunks", slots=1, families={"quick": Quick}, detach=detach)
    session, _ = core.hear(1, json.loads(core.init("m1", 1, "{}"))["session"], 0.0)
    core.resume(session)
    core.send([(n, "quick", json.dumps({"n": n})) for n in range(1, 101)], session)

    def all_done() -> bool:
        # heard from as a polling master would be: on a loaded machine the 100 jobs may
        # take longer than the detach time, which would stop the slot half way
        core.hear(1, session.number, 0.0)
        return core.remaining() == (0, 0, 100, 0)

    wait_for(all_done, 30, "the quick jobs")
    assert core._recent < 0.1  # their durations were learned (1.0 before any)
    # On a loaded machine the mean of 100 no-op jobs may stay just above QUICK_JOB (a
    # CI run saw 1.007 ms); the chunks are what these tests are about, so the slot is
    # held to quick jobs: it takes them in chunks from now on.
    core._recent = min(core._recent, QUICK_JOB / 2)
    return core, session


def a_chunk(core: AgentCore, session: Any) -> None:
    """Jobs 101..140, taken as a chunk whose first job sleeps past the detach time."""
    core.hear(1, session.number, 0.0)  # the master was just heard from
    slow = (101, "quick", json.dumps({"n": 101, "sleep": 0.8}))
    rest = [(n, "quick", json.dumps({"n": n})) for n in range(102, 141)]
    core.send([slow, *rest], session)
    wait_for(lambda: 101 in Quick.started, 10, "the chunk's first job")


def test_a_slot_starts_nothing_more_of_its_chunk_once_its_master_went_silent() -> None:
    """A chunk skips the check of each take from the queue: the slot makes it again
    before the rest once time passed (a freeze, a slow job), so a detached agent does not
    start up to a chunk of jobs its master may have placed elsewhere."""
    core, session = quick_core(detach=0.3)
    try:
        a_chunk(core, session)
        time.sleep(1.2)  # the slow job ended, the session detached meanwhile
        assert Quick.started[100:] == [101]
        assert core.remaining()[:2] == (39, 0)  # the rest back in the queue, unstarted
    finally:
        core.close()


def test_a_chunk_holds_its_results_for_the_master_as_it_goes() -> None:
    """A chunk taken while jobs were quick may meet slower ones: what it ran so far is
    held for the master each time the slot looks again, not once the whole chunk ended
    (the master would see the node run dry late, and refill it late)."""
    core, session = quick_core(detach=30)
    Quick.release.clear()
    try:
        core.hear(1, session.number, 0.0)
        slow = (101, "quick", json.dumps({"n": 101, "sleep": 0.05}))
        held = (102, "quick", json.dumps({"n": 102, "hold": True}))
        core.send([slow, held], session)  # one chunk of both
        wait_for(lambda: 102 in Quick.started, 10, "the chunk's second job")
        done = {row[0] for row in core.take("done", (), 1000, session)}
        assert 101 in done and 102 not in done
    finally:
        Quick.release.set()
        core.close()


def test_a_new_masters_init_lists_a_chunks_waiting_jobs_and_cancels_them() -> None:
    """A master that took over while a slot runs a chunk learns its jobs at ``init``,
    like queued ones, and the ones it cancels never start."""
    core, session = quick_core(detach=0.3)
    try:
        a_chunk(core, session)
        info = json.loads(core.init("m2", 2, "{}"))
        assert set(info["queued"]) == set(range(102, 141))
        second, resume = core.hear(2, info["session"], 0.0)
        assert resume
        core.cancel(info["queued"], second)
        core.resume(second)
        time.sleep(1.2)
        assert Quick.started[100:] == [101]
        assert core.remaining() == (0, 0, 101, 0)
    finally:
        core.close()
