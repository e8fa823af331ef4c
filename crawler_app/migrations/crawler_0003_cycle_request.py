"""page checker: operators' requests for a cycle now

Revision ID: crawler_0003
Revises: crawler_0002
Create Date: 2026-11-23 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0003"
down_revision = "crawler_0002"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0004"


def upgrade() -> None:
    op.create_table(
        "app_cycle_request",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("requested_at", sa.DateTime(), nullable=False),
        sa.Column("taken_at", sa.DateTime(), nullable=True),
        sa.Column("taken_by", sa.String(length=255), nullable=True),
        sa.Column("cycle_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["app_cycle.id"],
            name=op.f("fk_app_cycle_request_cycle_id_app_cycle"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["app_user.id"],
            name=op.f("fk_app_cycle_request_user_id_app_user"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_cycle_request")),
    )
    op.create_index("ix_app_cycle_request_taken", "app_cycle_request", ["taken_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_app_cycle_request_taken", table_name="app_cycle_request")
    op.drop_table("app_cycle_request")
