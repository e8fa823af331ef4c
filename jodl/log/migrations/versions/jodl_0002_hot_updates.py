"""reconstruction log: cheaper per-job updates (HOT-friendly jobs, a frequency index)

Jobs' homes and JobOnNode statistics are rewritten for many rows per cycle. On
PostgreSQL both tables keep half of each page free (fillfactor 50), so such an
update stays on its page and touches no index (a HOT update), and the homes lose
their foreign keys, whose per-row check cost more than the update itself (nodes
are never deleted, only marked removed; the master clears homes of a node gone
for good). Pages written before this revision keep their old fill until the
table is rewritten (``VACUUM FULL jodl_job``). A partial index finds the few
jobs that run every N cycles or at most every T seconds without a scan.

Revision ID: jodl_0002
Revises: jodl_0001
Create Date: 2026-11-21 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0002"
down_revision = "jodl_0001"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0005"

FREQUENCY = "every_n_cycles > 1 OR min_interval IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("jodl_job", schema=None) as batch_op:
        batch_op.drop_constraint("fk_jodl_job_permanent_node_id_jodl_node", type_="foreignkey")
        batch_op.drop_constraint("fk_jodl_job_trial_node_id_jodl_node", type_="foreignkey")
        batch_op.create_index(
            "ix_jodl_job_frequency",
            ["family_id"],
            unique=False,
            postgresql_where=sa.text(FREQUENCY),
            sqlite_where=sa.text(FREQUENCY),
        )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jodl_job SET (fillfactor = 50)")
        op.execute("ALTER TABLE jodl_job_on_node SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jodl_job_on_node RESET (fillfactor)")
        op.execute("ALTER TABLE jodl_job RESET (fillfactor)")
    with op.batch_alter_table("jodl_job", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_jodl_job_frequency",
            postgresql_where=sa.text(FREQUENCY),
            sqlite_where=sa.text(FREQUENCY),
        )
        batch_op.create_foreign_key(
            "fk_jodl_job_trial_node_id_jodl_node",
            "jodl_node",
            ["trial_node_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch_op.create_foreign_key(
            "fk_jodl_job_permanent_node_id_jodl_node",
            "jodl_node",
            ["permanent_node_id"],
            ["id"],
            ondelete="SET NULL",
        )
