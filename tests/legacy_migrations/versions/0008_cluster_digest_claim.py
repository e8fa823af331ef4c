"""effects: the cluster's identity, and the digests' shared claims

``jodl_cluster`` holds one random id per database: agents bind the execution ids
they remember to it. ``app_digest_claim`` holds the claim ``notify`` takes on a
digest's idempotency key before sending it, shared by every agent.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jodl_cluster",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jodl_cluster")),
    )
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
    op.drop_table("jodl_cluster")
