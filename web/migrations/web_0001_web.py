"""web UI: submitted batches, cache resets

Revision ID: web_0001
Revises:
Create Date: 2026-11-22 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "web_0001"
down_revision = None
branch_labels = ("web",)
depends_on = "crawler_0001"
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0003"

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "web_batch",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["app_user.id"],
            name=op.f("fk_web_batch_user_id_app_user"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_web_batch")),
    )
    op.create_index("ix_web_batch_created", "web_batch", ["created_at"], unique=False)
    op.create_table(
        "web_batch_item",
        sa.Column("batch_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("url", sa.String(length=2100), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("job_id", BigId, nullable=True),
        sa.Column("cached_exec_id", BigId, nullable=True),
        sa.Column("after_exec_id", BigId, nullable=False),
        sa.Column("previous_fingerprint", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["web_batch.id"],
            name=op.f("fk_web_batch_item_batch_id_web_batch"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("batch_id", "position", name=op.f("pk_web_batch_item")),
    )
    op.create_table(
        "web_cache_reset",
        sa.Column("job_id", BigId, autoincrement=False, nullable=False),
        sa.Column("floor_exec_id", BigId, nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("reset_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["app_user.id"],
            name=op.f("fk_web_cache_reset_user_id_app_user"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_web_cache_reset")),
    )


def downgrade() -> None:
    op.drop_table("web_cache_reset")
    op.drop_table("web_batch_item")
    op.drop_index("ix_web_batch_created", table_name="web_batch")
    op.drop_table("web_batch")
