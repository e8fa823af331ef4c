"""the execution-id sequence in its own table

Execution (and dispatch) ids were a column of the master's lease row
(``jodl_master_lease.next_exec_id``). They move to ``jodl_exec_id``, one row per
sequence (``master``), so that the queue takes ids without a lease row and a
standby master reads the lease without touching the counter. The current value is
carried over; a database that never had a master starts at 1.

Revision ID: jodl_0006
Revises: jodl_0005
Create Date: 2026-11-22 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = "jodl_0006"
down_revision = "jodl_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jodl_exec_id",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("next_id", BigId, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_jodl_exec_id")),
    )
    op.execute(
        "INSERT INTO jodl_exec_id (name, next_id) SELECT name, next_exec_id FROM jodl_master_lease"
    )
    op.execute(
        "INSERT INTO jodl_exec_id (name, next_id) SELECT 'master', 1 "
        "WHERE NOT EXISTS (SELECT 1 FROM jodl_exec_id WHERE name = 'master')"
    )
    with op.batch_alter_table("jodl_master_lease") as batch:
        batch.drop_column("next_exec_id")


def downgrade() -> None:
    with op.batch_alter_table("jodl_master_lease") as batch:
        batch.add_column(sa.Column("next_exec_id", BigId, nullable=False, server_default="1"))
    op.execute(
        "UPDATE jodl_master_lease SET next_exec_id = "
        "(SELECT next_id FROM jodl_exec_id WHERE jodl_exec_id.name = jodl_master_lease.name) "
        "WHERE EXISTS (SELECT 1 FROM jodl_exec_id WHERE jodl_exec_id.name = jodl_master_lease.name)"
    )
    with op.batch_alter_table("jodl_master_lease") as batch:
        batch.alter_column("next_exec_id", server_default=None)
    op.drop_table("jodl_exec_id")
