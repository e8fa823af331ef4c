"""The library's Alembic environment and its own branch of revisions (``versions/``)."""
