"""progress of running executions: how far each is, as its job said (``jodl.progress``)

Revision ID: jodl_0010
Revises: jodl_0009
Create Date: 2026-11-26 17:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0010"
down_revision = "jodl_0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jodl_progress",
        sa.Column(
            "exec_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("done", sa.Float(), nullable=False),
        sa.Column("total", sa.Float(), nullable=True),
        sa.Column("note", sa.String(200), nullable=False),
        sa.Column("reported_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_jodl_progress_run", "jodl_progress", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_jodl_progress_run", table_name="jodl_progress")
    op.drop_table("jodl_progress")
