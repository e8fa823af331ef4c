"""page checker: what varies per view, and script-built pages

``app_page_view.model`` holds a view's learned model (its baseline's line keys
and what varies on it, crawler_app.checking.variance); the pending candidate of the old
two-cycle confirmation goes (a change is now confirmed within one check).
``app_page.script_page`` flags pages that build their text with scripts.

Revision ID: crawler_0008
Revises: crawler_0007
Create Date: 2026-11-23 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0008"
down_revision = "crawler_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("app_page_view") as batch:
        batch.add_column(sa.Column("model", sa.JSON(), nullable=True))
        batch.drop_column("pending")
        batch.drop_column("pending_text")
        batch.drop_column("pending_since")
    with op.batch_alter_table("app_page") as batch:
        batch.add_column(
            sa.Column("script_page", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("app_page") as batch:
        batch.drop_column("script_page")
    with op.batch_alter_table("app_page_view") as batch:
        batch.add_column(sa.Column("pending_since", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("pending_text", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("pending", sa.String(length=64), nullable=True))
        batch.drop_column("model")
