"""page checker: the digests' shared claims

``app_digest_claim`` holds the claim ``notify`` takes on a digest's idempotency key
before sending it, shared by every agent.

Revision ID: crawler_0005
Revises: crawler_0004
Create Date: 2026-11-22 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0005"
down_revision = "crawler_0004"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0008"


def upgrade() -> None:
    op.create_table(
        "app_digest_claim",
        sa.Column("idem_key", sa.String(100), nullable=False),
        sa.Column("message_id", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("idem_key", name=op.f("pk_app_digest_claim")),
    )


def downgrade() -> None:
    op.drop_table("app_digest_claim")
