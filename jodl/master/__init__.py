"""The master: the loop, the job book, balancing (docs/architecture.md#the-master-loop).

loop.py       :class:`Master` — starts, runs cycles and serves; ``step()`` is the loop
book.py       :class:`JobBook` — every held job's stage, changed by named transitions
nodes.py      :class:`Nodes` — agents connected, refreshed, lost (their jobs given back)
families.py   :class:`FamilySettings` — strategy, attempts, node rules and caps per family
dispatch.py   :class:`Dispatcher` — the assign and send steps
outcomes.py   :class:`Outcomes` — results and failures collected, committed, acknowledged
runs.py       :class:`RunKeeper` — runs opened (resumed) and finished
balancer.py   :class:`Balancer` — steals, timeouts, backups
trials.py     :class:`TrialMoves` — homes and trial moves
rules.py      the cost model and the balancing decisions (pure functions)
records.py    run summaries, execution rows, the ledger that commits them
"""

from ..exceptions import JodlError
from .balancer import Balancer
from .book import JobBook, Stage
from .feeder import Feeder, FeedHost
from .loop import Master
from .nodes import NodeSlot
from .records import ActiveRun, RunSummary

__all__ = [
    "ActiveRun",
    "Balancer",
    "FeedHost",
    "Feeder",
    "JobBook",
    "JodlError",
    "Master",
    "NodeSlot",
    "RunSummary",
    "Stage",
]
