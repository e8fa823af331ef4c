"""page checker: notification channels and Atom feeds

``app_channel``: a user's notification channels (Apprise URLs); ``app_delivery``:
a digest sent to one channel (its key, job, state); ``app_user.feed_token``: the
secret in the URL of the user's Atom feed.

Revision ID: crawler_0010
Revises: crawler_0009
Create Date: 2026-11-26 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0010"
down_revision = "crawler_0009"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("app_user") as batch:
        batch.add_column(sa.Column("feed_token", sa.String(64), nullable=True))
        batch.create_unique_constraint(op.f("uq_app_user_feed_token"), ["feed_token"])
    op.create_table(
        "app_channel",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["app_user.id"],
            name=op.f("fk_app_channel_user_id_app_user"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_channel")),
        sa.UniqueConstraint("user_id", "url", name="uq_app_channel_user_url"),
    )
    op.create_table(
        "app_delivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("notification_id", sa.Integer(), nullable=False),
        sa.Column("channel_id", sa.Integer(), nullable=True),
        sa.Column("idem_key", sa.String(100), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("job_id", _BIG_ID, nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["notification_id"],
            ["app_notification.id"],
            name=op.f("fk_app_delivery_notification_id_app_notification"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["app_channel.id"],
            name=op.f("fk_app_delivery_channel_id_app_channel"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jodl_job.id"],
            name=op.f("fk_app_delivery_job_id_jodl_job"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_delivery")),
        sa.UniqueConstraint("idem_key", name=op.f("uq_app_delivery_idem_key")),
    )
    op.create_index(op.f("ix_app_delivery_notification_id"), "app_delivery", ["notification_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_app_delivery_notification_id"), table_name="app_delivery")
    op.drop_table("app_delivery")
    op.drop_table("app_channel")
    with op.batch_alter_table("app_user") as batch:
        batch.drop_constraint(op.f("uq_app_user_feed_token"), type_="unique")
        batch.drop_column("feed_token")
