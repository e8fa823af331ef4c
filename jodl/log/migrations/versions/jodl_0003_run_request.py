"""reconstruction log: cycles asked of the running master (jodl run beside it)

Revision ID: jodl_0003
Revises: jodl_0002
Create Date: 2026-11-22 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0003"
down_revision = "jodl_0002"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0007"


def upgrade() -> None:
    op.create_table(
        "jodl_run_request",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(length=100), nullable=False),
        sa.Column("requested_at", sa.DateTime(), nullable=False),
        sa.Column("taken_at", sa.DateTime(), nullable=True),
        sa.Column("taken_by", sa.String(length=255), nullable=True),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("dead", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jodl_run_request")),
    )
    op.create_index("ix_jodl_run_request_taken", "jodl_run_request", ["taken_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jodl_run_request_taken", table_name="jodl_run_request")
    op.drop_table("jodl_run_request")
