"""cost control: per-family budgets

``jodl_family_budget`` holds a family's budgets (NULL keeps the ``JODL_FAMILY_*``
default) and the on-demand jobs claimed in the current hour; ``jodl_run`` records
how many due jobs a budget put off to the next run and, with a jobs-per-cycle
budget, where the run's membership was cut.

Revision ID: jodl_0005
Revises: jodl_0004
Create Date: 2026-11-22 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = "jodl_0005"
down_revision = "jodl_0004"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0010"


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


def downgrade() -> None:
    with op.batch_alter_table("jodl_run") as batch:
        batch.drop_column("cut_job_id")
        batch.drop_column("cut_number")
        batch.drop_column("deferred")
    op.drop_table("jodl_family_budget")
