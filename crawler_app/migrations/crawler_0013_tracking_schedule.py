"""page checker: a tracking's schedule, and where a page's schedule counts from

``app_tracking.every`` (seconds) or ``app_tracking.cron`` (five cron fields, local
time): when the tracking wants its page checked; neither follows the operator's
``JODL_SCHEDULE``. ``app_page.slot_at``: the start, on the scheduler's tick grid, of
the cycle that last checked the page; the trackings' next due times count from it
(docs/schedules.md). NULL until a cycle checks the page.

Revision ID: crawler_0013
Revises: crawler_0012
Create Date: 2026-11-26 19:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0013"
down_revision = "crawler_0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("app_tracking") as batch:
        batch.add_column(sa.Column("every", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cron", sa.String(100), nullable=True))
    with op.batch_alter_table("app_page") as batch:
        batch.add_column(sa.Column("slot_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("app_page") as batch:
        batch.drop_column("slot_at")
    with op.batch_alter_table("app_tracking") as batch:
        batch.drop_column("cron")
        batch.drop_column("every")
