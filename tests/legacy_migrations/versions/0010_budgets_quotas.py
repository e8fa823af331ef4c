"""cost control: per-user quotas, per-family budgets

``jodl_family_budget`` holds a family's budgets (NULL keeps the ``JODL_FAMILY_*``
default) and the on-demand jobs claimed in the current hour; ``jodl_run`` records
how many due jobs a budget put off to the next run and, with a jobs-per-cycle
budget, where the run's membership was cut.

``app_user_quota`` holds an operator's limits for one user (NULL keeps the
``JODL_USER_*`` default); ``web_batch`` gets an index by user and time (the URLs
a user submitted in the last 24 hours are counted at each submission).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-22 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jodl_family_budget",
        sa.Column("family_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("jobs_per_cycle", sa.Integer(), nullable=True),
        sa.Column("ondemand_per_hour", sa.Integer(), nullable=True),
        sa.Column("bytes_per_cycle", sa.BigInteger(), nullable=True),
        sa.Column("hour_start", sa.DateTime(), nullable=True),
        sa.Column("hour_used", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["family_id"],
            ["jodl_family.id"],
            name=op.f("fk_jodl_family_budget_family_id_jodl_family"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("family_id", name=op.f("pk_jodl_family_budget")),
    )
    with op.batch_alter_table("jodl_run") as batch:
        batch.add_column(sa.Column("deferred", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("cut_number", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cut_job_id", BigId, nullable=True))
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
    with op.batch_alter_table("jodl_run") as batch:
        batch.drop_column("cut_job_id")
        batch.drop_column("cut_number")
        batch.drop_column("deferred")
    op.drop_table("jodl_family_budget")
