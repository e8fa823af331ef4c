"""page checker: pages rendered in a browser

``app_tracking.browser``: the tracker wants the page rendered (it builds its text
with JavaScript); ``app_page.browser``: some tracker does, so the page is
rendered for all; ``app_page.refused_requests``: requests the page made that
the last rendering refused.

Revision ID: crawler_0009
Revises: crawler_0008
Create Date: 2026-11-25 20:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0009"
down_revision = "crawler_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("app_tracking") as batch:
        batch.add_column(
            sa.Column("browser", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    with op.batch_alter_table("app_page") as batch:
        batch.add_column(
            sa.Column("browser", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.add_column(sa.Column("refused_requests", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("app_page") as batch:
        batch.drop_column("refused_requests")
        batch.drop_column("browser")
    with op.batch_alter_table("app_tracking") as batch:
        batch.drop_column("browser")
