"""page checker: operators (an admin flag on users)

Revision ID: crawler_0002
Revises: crawler_0001
Create Date: 2026-11-22 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0002"
down_revision = "crawler_0001"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0003"


def upgrade() -> None:
    with op.batch_alter_table("app_user") as batch:
        batch.add_column(
            sa.Column("is_admin", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("app_user") as batch:
        batch.drop_column("is_admin")
