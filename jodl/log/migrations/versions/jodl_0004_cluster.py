"""effects: the cluster's identity

``jodl_cluster`` holds one random id per database: agents bind the execution ids
they remember to it.

Revision ID: jodl_0004
Revises: jodl_0003
Create Date: 2026-11-22 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0004"
down_revision = "jodl_0003"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0008"


def upgrade() -> None:
    op.create_table(
        "jodl_cluster",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jodl_cluster")),
    )


def downgrade() -> None:
    op.drop_table("jodl_cluster")
