"""A faulty agent for tests: the real server, handshake and jobs, but one call answers wrong.

``python faulty_agent.py HOST:PORT FAULT`` (settings from ``JODL_*`` as for
``jodl agent``). FAULT names a call and what it returns instead of its reply.
"""

from __future__ import annotations

import sys
from typing import Any

from jodl.agent.server import AgentService, make_server
from jodl.config import Settings


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
    "init-slots-as-text": ("init", lambda real: real.replace('"slots":', '"slots":"4","x":')),
    "send-netref": ("send", lambda real: Exhibit()),
}


def main() -> None:
    listen, fault = sys.argv[1], sys.argv[2]
    call, wrong = FAULTS[fault]
    real = getattr(AgentService, f"exposed_{call}")

    def faulty(self: AgentService, *args: Any) -> Any:
        return wrong(real(self, *args))

    service_class = type("FaultyService", (AgentService,), {f"exposed_{call}": faulty})
    server = make_server(Settings.from_env(), listen=listen)
    server.service.__class__ = service_class
    print(f"faulty agent ({fault}) listening on {listen}", file=sys.stderr, flush=True)
    server.start()


if __name__ == "__main__":
    main()
