"""The library's revisions: the Alembic branch ``jodl``."""
