"""JODL, the Job Dispatching Library.

A master runs *families* of jobs in *cycles* on many *agents* over rpyc, places
jobs with a pluggable strategy that learns how long each job takes on each node,
and writes every decision to a SQL reconstruction log so that a master killed at
any moment resumes its cycle without redoing finished jobs.
"""

from .client import add_jobs as add_jobs
from .client import connect as connect
from .client import results as results
from .config import Settings as Settings
from .exceptions import JodlError as JodlError
from .family import Family as Family
from .family import Permanent as Permanent
from .log.engine import make_engine as make_engine
from .log.records import JobResult as JobResult
from .log.records import RunResults as RunResults
from .log.store import Store as Store
from .master import Master as Master
from .master import RunSummary as RunSummary
from .placement import Knowledge as Knowledge
from .placement import NodeLoad as NodeLoad
from .placement import Placement as Placement
from .placement import register as register_strategy
from .queue import Queue as Queue
from .queue import QueueFeeder as QueueFeeder

__all__ = [
    "Family",
    "JobResult",
    "JodlError",
    "Knowledge",
    "Master",
    "NodeLoad",
    "Permanent",
    "Placement",
    "Queue",
    "QueueFeeder",
    "RunResults",
    "RunSummary",
    "Settings",
    "Store",
    "add_jobs",
    "connect",
    "make_engine",
    "register_strategy",
    "results",
]
__version__ = "0.1.0"
