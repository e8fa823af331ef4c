"""The checkout's Alembic environment, named by ``alembic.ini``: ``alembic upgrade heads``
(database from ``JODL_DATABASE_URL``) and ``alembic revision`` work here.

The revisions stay with the code that owns their tables, so that an installed package
carries its own: the library's in ``jodl/log/migrations/versions``, the page checker's
in ``crawler_app/migrations``, the web UI's in ``web/migrations`` (``alembic.ini``'s
``version_locations``). ``jodl db upgrade`` runs the same environment from the
installed package (docs/architecture.md#migrations).
"""

from jodl.log.migrate import run_environment

run_environment()
