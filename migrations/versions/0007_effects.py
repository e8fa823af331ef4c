"""cluster identity: agents bind what they remember to the database they serve

Revision ID: 0007_effects
Revises: 0006
Create Date: 2026-11-22 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_effects"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jodl_cluster",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jodl_cluster")),
    )


def downgrade() -> None:
    op.drop_table("jodl_cluster")
