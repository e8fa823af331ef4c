"""The installed package's Alembic environment (``jodl db upgrade``): the same as the
checkout's ``migrations/env.py``, both in :func:`jodl.log.migrate.run_environment`."""

from jodl.log.migrate import run_environment

run_environment()
