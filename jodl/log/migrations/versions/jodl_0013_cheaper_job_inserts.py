"""cheaper job inserts: no foreign keys on jodl_job, no index entry for an idle job

Adding jobs in bulk (``jodl jobs add --from``, ``add_jobs``) spent most of its
time in work per row that no read needs: the foreign keys' checks (family and
run, a trigger call per row, a third of an insert) and entries of ``ix_jodl_job_due``
and ``ix_jodl_job_run`` for jobs that have neither a run nor a state other than
idle. Deleting a family deletes its jobs and then its runs itself (no cascade
is left to do), and runs are deleted with their family only. The two indexes now
hold only the rows their reads ask for: ``ix_jodl_job_run`` jobs with a run (the
dead jobs of a run), ``ix_jodl_job_due`` jobs not idle (the on-demand queue's
states, dead and deleted jobs); idle jobs are found by family
(``uq_jodl_job_family_key``, ``ix_jodl_job_idle_due``).

Revision ID: jodl_0013
Revises: jodl_0012
Create Date: 2026-11-27 02:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0013"
down_revision = "jodl_0012"
branch_labels = None
depends_on = None

NOT_IDLE = "state <> 'idle'"
WITH_RUN = "run_id IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("jodl_job") as batch:
        batch.drop_constraint("fk_jodl_job_family_id_jodl_family", type_="foreignkey")
        batch.drop_constraint("fk_jodl_job_run_id_jodl_run", type_="foreignkey")
        batch.drop_index("ix_jodl_job_due")
        batch.drop_index("ix_jodl_job_run")
        batch.create_index(
            "ix_jodl_job_due",
            ["state", "due_at"],
            postgresql_where=sa.text(NOT_IDLE),
            sqlite_where=sa.text(NOT_IDLE),
        )
        batch.create_index(
            "ix_jodl_job_run",
            ["run_id"],
            postgresql_where=sa.text(WITH_RUN),
            sqlite_where=sa.text(WITH_RUN),
        )


def downgrade() -> None:
    with op.batch_alter_table("jodl_job") as batch:
        batch.drop_index("ix_jodl_job_run")
        batch.drop_index("ix_jodl_job_due")
        batch.create_index("ix_jodl_job_run", ["run_id"], unique=False)
        batch.create_index("ix_jodl_job_due", ["state", "due_at"], unique=False)
        batch.create_foreign_key(
            "fk_jodl_job_run_id_jodl_run", "jodl_run", ["run_id"], ["id"], ondelete="SET NULL"
        )
        batch.create_foreign_key(
            "fk_jodl_job_family_id_jodl_family",
            "jodl_family",
            ["family_id"],
            ["id"],
            ondelete="CASCADE",
        )
