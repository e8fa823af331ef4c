"""page checker: users, pages, trackings, views, snapshots, cycles, notifications

Revision ID: crawler_0001
Revises:
Create Date: 2026-11-21 07:53:50.322798
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0001"
down_revision = None
branch_labels = ("crawler_app",)
depends_on = "jodl_0001"
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0002"


def upgrade() -> None:
    op.create_table(
        "app_user",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_user")),
        sa.UniqueConstraint("email", name=op.f("uq_app_user_email")),
    )
    op.create_table(
        "app_cycle",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("is_open", sa.Boolean(), nullable=True),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("spread", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("step_started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("check_run_id", sa.Integer(), nullable=True),
        sa.Column("notify_run_id", sa.Integer(), nullable=True),
        sa.Column("pages", sa.Integer(), nullable=False),
        sa.Column("checked", sa.Integer(), nullable=False),
        sa.Column("not_modified", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("changed", sa.Integer(), nullable=False),
        sa.Column("notifications", sa.Integer(), nullable=False),
        sa.Column("sent", sa.Integer(), nullable=False),
        sa.Column("timings", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["check_run_id"],
            ["jodl_run.id"],
            name=op.f("fk_app_cycle_check_run_id_jodl_run"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["notify_run_id"],
            ["jodl_run.id"],
            name=op.f("fk_app_cycle_notify_run_id_jodl_run"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_cycle")),
        sa.UniqueConstraint("is_open", name=op.f("uq_app_cycle_is_open")),
    )
    op.create_table(
        "app_notification",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cycle_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("idem_key", sa.String(length=100), nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("snapshots", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["app_cycle.id"],
            name=op.f("fk_app_notification_cycle_id_app_cycle"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jodl_job.id"],
            name=op.f("fk_app_notification_job_id_jodl_job"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["app_user.id"],
            name=op.f("fk_app_notification_user_id_app_user"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_notification")),
        sa.UniqueConstraint("cycle_id", "user_id", name="uq_app_notification_cycle_user"),
        sa.UniqueConstraint("idem_key", name=op.f("uq_app_notification_idem_key")),
    )
    op.create_table(
        "app_page",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("etag", sa.String(length=1024), nullable=True),
        sa.Column("last_modified", sa.String(length=255), nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("title", sa.String(length=300), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_checked_at", sa.DateTime(), nullable=True),
        sa.Column("last_changed_at", sa.DateTime(), nullable=True),
        sa.Column("period", sa.Integer(), nullable=False),
        sa.Column("analysed_cycle_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jodl_job.id"],
            name=op.f("fk_app_page_job_id_jodl_job"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_page")),
        sa.UniqueConstraint("job_id", name=op.f("uq_app_page_job_id")),
        sa.UniqueConstraint("url", name=op.f("uq_app_page_url")),
    )
    op.create_table(
        "app_page_view",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("page_id", sa.Integer(), nullable=False),
        sa.Column("selector", sa.String(length=500), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("recent", sa.JSON(), nullable=False),
        sa.Column("pending", sa.String(length=64), nullable=True),
        sa.Column("pending_text", sa.LargeBinary(), nullable=True),
        sa.Column("pending_since", sa.DateTime(), nullable=True),
        sa.Column("last_changed_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["page_id"],
            ["app_page.id"],
            name=op.f("fk_app_page_view_page_id_app_page"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_page_view")),
        sa.UniqueConstraint("page_id", "selector", name="uq_app_page_view_page_selector"),
    )
    op.create_table(
        "app_snapshot",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("page_id", sa.Integer(), nullable=False),
        sa.Column("selector", sa.String(length=500), nullable=False),
        sa.Column("cycle_id", sa.Integer(), nullable=True),
        sa.Column("taken_at", sa.DateTime(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("text_z", sa.LargeBinary(), nullable=True),
        sa.Column("chars", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["app_cycle.id"],
            name=op.f("fk_app_snapshot_cycle_id_app_cycle"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["page_id"],
            ["app_page.id"],
            name=op.f("fk_app_snapshot_page_id_app_page"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_snapshot")),
    )
    with op.batch_alter_table("app_snapshot", schema=None) as batch_op:
        batch_op.create_index("ix_app_snapshot_cycle", ["cycle_id"], unique=False)
        batch_op.create_index("ix_app_snapshot_view", ["page_id", "selector", "id"], unique=False)

    op.create_table(
        "app_tracking",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("page_id", sa.Integer(), nullable=False),
        sa.Column("selector", sa.String(length=500), nullable=True),
        sa.Column("since", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["page_id"],
            ["app_page.id"],
            name=op.f("fk_app_tracking_page_id_app_page"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["app_user.id"],
            name=op.f("fk_app_tracking_user_id_app_user"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_tracking")),
        sa.UniqueConstraint("user_id", "page_id", name="uq_app_tracking_user_page"),
    )
    with op.batch_alter_table("app_tracking", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_app_tracking_page_id"), ["page_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("app_tracking", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_app_tracking_page_id"))

    op.drop_table("app_tracking")
    with op.batch_alter_table("app_snapshot", schema=None) as batch_op:
        batch_op.drop_index("ix_app_snapshot_view")
        batch_op.drop_index("ix_app_snapshot_cycle")

    op.drop_table("app_snapshot")
    op.drop_table("app_page_view")
    op.drop_table("app_page")
    op.drop_table("app_notification")
    op.drop_table("app_cycle")
    op.drop_table("app_user")
