"""web: confirmed e-mail addresses, revocable sessions

Users get ``email_confirmed`` (existing ones are: they were added by operators or
signed up before confirmation existed) and ``session_version`` (a web session
names the version it was opened under; logout and password changes raise it).

Revision ID: crawler_0006
Revises: crawler_0005
Create Date: 2026-11-22 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0006"
down_revision = "crawler_0005"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0009"


def upgrade() -> None:
    with op.batch_alter_table("app_user") as batch:
        batch.add_column(
            sa.Column("email_confirmed", sa.Boolean(), server_default=sa.true(), nullable=False)
        )
        batch.add_column(
            sa.Column("session_version", sa.Integer(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("app_user") as batch:
        batch.drop_column("session_version")
        batch.drop_column("email_confirmed")
