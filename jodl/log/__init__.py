"""The reconstruction log: its tables, the one gateway to them, the log writer, and the
library's migrations (``jodl/log/migrations``).

Every statement on the library's tables lives in this package, behind named
methods of :class:`~jodl.log.store.Store` and the gateways it is composed of.

Public (``__all__`` below; docs/architecture.md#parts-and-layering): the gateway
(:class:`Store`, :class:`Reads`, :class:`JobLog`, :func:`make_engine`), the result
records, the watch over ended on-demand jobs (:class:`ResultWatch`,
:class:`Subscription`, :class:`Noticed`, their PostgreSQL channel :data:`RESULTS_CHANNEL`), and the
tables applications point foreign keys at or read states of
(:class:`Base`, :data:`BigId`, :class:`Job`, :class:`Run`, :class:`Node`,
:class:`Execution`, their ``*State`` constants, :func:`utcnow`), and the tables
audits and benchmarks read (:class:`Dispatch`, :class:`MasterLease`). The modules of this
package (``jodl.log.models``, ``jodl.log.store`` ...) are internal: import from here.
"""

from .engine import make_engine as make_engine
from .engine import normalise_url as normalise_url
from .jobs import JobLog as JobLog
from .models import Base as Base
from .models import BigId as BigId
from .models import Dispatch as Dispatch
from .models import ExecState as ExecState
from .models import Execution as Execution
from .models import Job as Job
from .models import JobState as JobState
from .models import MasterLease as MasterLease
from .models import Node as Node
from .models import NodeState as NodeState
from .models import RequestKind as RequestKind
from .models import Run as Run
from .models import RunState as RunState
from .models import utcnow as utcnow
from .notices import CHANNEL as RESULTS_CHANNEL
from .notices import Noticed as Noticed
from .notices import ResultWatch as ResultWatch
from .notices import Subscription as Subscription
from .reads import Reads as Reads
from .records import DoneResult as DoneResult
from .records import JobError as JobError
from .records import JobResult as JobResult
from .records import RunResults as RunResults
from .store import Store as Store

__all__ = [
    "Base",
    "BigId",
    "DoneResult",
    "Dispatch",
    "ExecState",
    "Execution",
    "Job",
    "MasterLease",
    "JobError",
    "JobLog",
    "JobResult",
    "JobState",
    "Node",
    "NodeState",
    "Noticed",
    "Reads",
    "Run",
    "RunResults",
    "RequestKind",
    "RESULTS_CHANNEL",
    "ResultWatch",
    "RunState",
    "Store",
    "Subscription",
    "make_engine",
    "normalise_url",
    "utcnow",
]
