"""node key generations: one node's key replaced alone (``jodl node rekey``)

A node's key was a function of the cluster secret and its address only, so the
one way to replace a compromised node's key was a new secret for the whole cluster
or a new address. ``key_generation`` is the node key's newest generation and
``key_oldest`` the oldest one masters still accept; a node never rekeyed has 0 and
0, whose key is the one every agent holds today.

Revision ID: jodl_0012
Revises: jodl_0011
Create Date: 2026-11-26 23:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0012"
down_revision = "jodl_0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jodl_node") as batch:
        batch.add_column(
            sa.Column("key_generation", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("key_oldest", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jodl_node") as batch:
        batch.drop_column("key_oldest")
        batch.drop_column("key_generation")
