"""live masters: one row per master process (heartbeat, role, scopes led)

Standby masters register here beside the leader; leadership itself stays in
``jodl_master_lease`` (one row per scope, its epoch the fencing token).

Revision ID: jodl_0008
Revises: jodl_0007
Create Date: 2026-11-22 18:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0008"
down_revision = "jodl_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jodl_master_node",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_jodl_master_node")),
    )


def downgrade() -> None:
    op.drop_table("jodl_master_node")
