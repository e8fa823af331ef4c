"""The page checker's Alembic branch (``crawler_app``), announced to ``jodl db upgrade``
through the entry-point group ``jodl.migrations``; its first revision depends on the
library's first. Importing this package registers the page checker's models."""

from .. import models as models
