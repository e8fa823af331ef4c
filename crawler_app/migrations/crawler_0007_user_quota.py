"""page checker: per-user quotas

``app_user_quota`` holds an operator's limits for one user (NULL keeps the
``JODL_USER_*`` default).

Revision ID: crawler_0007
Revises: crawler_0006
Create Date: 2026-11-22 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0007"
down_revision = "crawler_0006"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0010"


def upgrade() -> None:
    op.create_table(
        "app_user_quota",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("trackings", sa.Integer(), nullable=True),
        sa.Column("urls_per_day", sa.Integer(), nullable=True),
        sa.Column("batch", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["app_user.id"],
            name=op.f("fk_app_user_quota_user_id_app_user"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_app_user_quota")),
    )


def downgrade() -> None:
    op.drop_table("app_user_quota")
