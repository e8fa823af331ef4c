"""The ``jodl`` command (:mod:`.main`) and its groups, one module each.

Command plug-ins of applications use :mod:`.context` (settings, store, logging),
:mod:`.budget` (the budget parameter type) and :mod:`.progress` (progress reporting).
"""

from .main import main

__all__ = ["main"]
