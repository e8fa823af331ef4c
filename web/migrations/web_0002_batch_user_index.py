"""web UI: submitted batches by user and time

``web_batch`` gets an index by user and time (the URLs a user submitted in the last
24 hours are counted at each submission).

Revision ID: web_0002
Revises: web_0001
Create Date: 2026-11-22 16:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "web_0002"
down_revision = "web_0001"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0010"


def upgrade() -> None:
    op.create_index("ix_web_batch_user_created", "web_batch", ["user_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_web_batch_user_created", table_name="web_batch")
