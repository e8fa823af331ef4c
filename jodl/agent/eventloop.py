"""The agent's event loop for async families: uvloop when installed, else asyncio's own."""

from __future__ import annotations

import asyncio

from ..exceptions import JodlError


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A new event loop: ``uvloop``, ``asyncio``, or ``auto`` (uvloop when installed).

    uvloop runs its I/O and callbacks in C; ``bench/pagecheck.py --agent-loop
    asyncio`` compares the two (measured: 0.26–0.30 ms of agent CPU per page on
    uvloop, 0.28–0.30 ms on asyncio's own loop).
    """
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise JodlError("JODL_AGENT_LOOP=uvloop, but uvloop is not installed") from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
