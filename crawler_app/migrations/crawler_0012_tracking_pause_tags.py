"""page checker: a tracking may be paused, and carries tags

``app_tracking.paused``: a paused tracking keeps its history and its views but
does not ask for checks; a page whose trackings are all paused is not fetched
(its job is retired as if nobody tracked it, and revived on resume), and a
paused tracking gets no digest. ``app_tracking.tags``: its user's labels (a JSON
list), searched with the URL and title on the tracked pages.

Revision ID: crawler_0012
Revises: crawler_0011
Create Date: 2026-11-26 17:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0012"
down_revision = "crawler_0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("app_tracking") as batch:
        batch.add_column(
            sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("app_tracking") as batch:
        batch.drop_column("tags")
        batch.drop_column("paused")
