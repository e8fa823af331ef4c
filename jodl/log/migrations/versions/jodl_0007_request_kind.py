"""what a request asks of the running master: a cycle, a cancel, deleted jobs

``jodl_run_request`` rows asked only for cycles (``jodl run`` beside a master). A
``kind`` column lets the same table carry ``jodl run cancel FAMILY`` (end the
family's running cycle) and ``jodl jobs delete`` (stop the family's deleted jobs in
flight); existing rows are cycles.

Revision ID: jodl_0007
Revises: jodl_0006
Create Date: 2026-11-22 18:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0007"
down_revision = "jodl_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jodl_run_request") as batch:
        batch.add_column(
            sa.Column("kind", sa.String(length=16), nullable=False, server_default="run")
        )


def downgrade() -> None:
    with op.batch_alter_table("jodl_run_request") as batch:
        batch.drop_column("kind")
