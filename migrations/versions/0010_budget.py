"""cost control: per-user quotas

``app_user_quota`` holds an operator's limits for one user (NULL keeps the
``JODL_USER_*`` default); ``web_batch`` gets an index by user and time (the URLs
a user submitted in the last 24 hours are counted at each submission).

Revision ID: 0010_budget
Revises: 0009
Create Date: 2026-11-22 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_budget"
down_revision = "0009"
branch_labels = None
depends_on = None


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
    # A user's submissions of the last 24 hours are counted at each submission.
    op.create_index("ix_web_batch_user_created", "web_batch", ["user_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_web_batch_user_created", table_name="web_batch")
    op.drop_table("app_user_quota")
