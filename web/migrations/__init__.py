"""The web UI's Alembic branch (``web``), announced to ``jodl db upgrade`` through the
entry-point group ``jodl.migrations``; its first revision depends on the page checker's
first (its tables refer to the page checker's users). Importing this package registers
the web UI's models."""

from .. import models as models
