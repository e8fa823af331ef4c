"""page checker: a tracking's name

``app_tracking.name``: what the user calls the tracking (a urlwatch job's ``name``
is kept through an import and an export); NULL: the page's title is shown.

Revision ID: crawler_0014
Revises: crawler_0013
Create Date: 2026-11-26 20:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0014"
down_revision = "crawler_0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("app_tracking") as batch:
        batch.add_column(sa.Column("name", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("app_tracking") as batch:
        batch.drop_column("name")
