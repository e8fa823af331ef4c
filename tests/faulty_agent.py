"""A faulty agent for tests: the real server, handshake and jobs, but one call answers wrong.

``python faulty_agent.py HOST:PORT FAULT[,FAULT...]`` (settings from ``JODL_*`` as
for ``jodl agent``). A FAULT names a call and what it returns instead of its reply.
"""

from __future__ import annotations

import sys
from typing import Any

from jodl.agent.server import AgentService, make_server
from jodl.settings.config import Settings


class Exhibit:
    """An object of the agent's: reaches the master as a netref."""

    def __int__(self) -> int:
        return 7


#: Fault name -> (call, reply instead of the real one).
FAULTS: dict[str, tuple[str, Any]] = {
    "done-netref": ("done", lambda real: [Exhibit()]),
    "done-malformed": ("done", lambda real: "1,2\n0.1\n1.0\nnull"),
    "done-not-json": ("done", lambda real: "1\n0.001\n1700000000.0\n{not json"),
    "done-nan": ("done", lambda real: "1\nnan\n1700000000.0\nnull"),
    # A master collects with ``outcomes`` while it has jobs on the agent: the same
    # faults in its results, and a failure of the wrong shape beside real results.
    "outcomes-netref": ("outcomes", lambda real: (Exhibit(), real[1])),
    "outcomes-malformed": ("outcomes", lambda real: ("1,2\n0.1\n1.0\nnull", real[1])),
    "outcomes-not-json": ("outcomes", lambda real: ("1\n0.001\n1700000000.0\n{x", real[1])),
    "outcomes-nan": ("outcomes", lambda real: ("1\nnan\n1700000000.0\nnull", real[1])),
    "outcomes-failed-shape": (
        "outcomes",
        lambda real: (real[0], ((1, 0.1, 1700000000.0, "error", "yes"),)),
    ),
    # A master sends with ``exchange`` to an agent it also collects from: faults in the
    # refusals, in the results and in the failures it answers with.
    "exchange-netref": ("exchange", lambda real: (real[0], Exhibit(), real[2])),
    "exchange-refused-netref": ("exchange", lambda real: (Exhibit(), real[1], real[2])),
    "exchange-not-json": ("exchange", lambda real: (real[0], "1\n0.001\n1700000000.0\n{", real[2])),
    "exchange-failed-shape": (
        "exchange",
        lambda real: (real[0], real[1], ((1, 0.1, 1700000000.0, "error", "yes"),)),
    ),
    "init-slots-as-text": ("init", lambda real: real.replace('"slots":', '"slots":"4","x":')),
    "send-netref": ("send", lambda real: Exhibit()),
    # A reply of the wrong shape for each call (values only: no netref involved).
    "init-shape": ("init", lambda real: '{"name": "half an info"}'),
    "send-shape": ("send", lambda real: ((1,),)),
    "done-shape": ("done", lambda real: ((1, 0.1, 1700000000.0),)),
    "failed-shape": ("failed", lambda real: ((1, 0.1, 1700000000.0, "error", "yes"),)),
    "outcomes-shape": ("outcomes", lambda real: (real[0],)),
    "exchange-shape": ("exchange", lambda real: (real[1], real[2])),
    "remaining-shape": ("remaining", lambda real: (0, 0, 0)),
    "take_back-shape": ("take_back", lambda real: ("1",)),
    "ack-shape": ("ack", lambda real: -1),
    "cancel-shape": ("cancel", lambda real: (1.5,)),
    "held-shape": ("held", lambda real: "1,2"),
    "ping-shape": ("ping", lambda real: ("agent", "1", 0.0)),
    "families-shape": ("families", lambda real: (("noop", 1, False, True),)),
}


def main() -> None:
    listen, faults = sys.argv[1], sys.argv[2].split(",")
    methods = {}
    for fault in faults:
        call, wrong = FAULTS[fault]
        methods[f"exposed_{call}"] = _faulty(getattr(AgentService, f"exposed_{call}"), wrong)
    service_class = type("FaultyService", (AgentService,), methods)
    server = make_server(Settings.from_env(), listen=listen)
    server.service.__class__ = service_class
    print(f"faulty agent ({','.join(faults)}) listening on {listen}", file=sys.stderr, flush=True)
    server.start()


def _faulty(real: Any, wrong: Any) -> Any:
    def faulty(self: AgentService, *args: Any) -> Any:
        return wrong(real(self, *args))

    return faulty


if __name__ == "__main__":
    main()
