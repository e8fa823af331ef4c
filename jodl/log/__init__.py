"""The reconstruction log: its tables, the one gateway to them, the log writer, and the
library's migrations (``jodl/log/migrations``).

Every statement on the library's tables lives in this package, behind named
methods of :class:`~jodl.log.store.Store` and the gateways it is composed of.
"""

from .engine import make_engine as make_engine
from .engine import normalise_url as normalise_url
from .reads import Reads as Reads
from .records import DoneResult as DoneResult
from .records import JobError as JobError
from .records import JobResult as JobResult
from .records import RunResults as RunResults
from .store import Store as Store

__all__ = [
    "DoneResult",
    "JobError",
    "JobResult",
    "Reads",
    "RunResults",
    "Store",
    "make_engine",
    "normalise_url",
]
