"""a cycle job's due time: ``jodl_job.due_at`` also holds an idle job back from runs

``due_at`` was the on-demand queue's due time only. An idle job (one the family's
cycles run) with a ``due_at`` is now left out of every run that opens before it
(``jodl.log.runs._member_filter``); NULL keeps today's rule. Idle jobs had no due
time to keep: any left from an on-demand past is cleared, so no job is held back by
the upgrade. The partial index finds a family's earliest due idle job at once
(``Reads.next_due``), without reading the jobs with no due time.

Revision ID: jodl_0011
Revises: jodl_0010
Create Date: 2026-11-26 19:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0011"
down_revision = "jodl_0010"
branch_labels = None
depends_on = None

IDLE_DUE = "state = 'idle' AND due_at IS NOT NULL"


def upgrade() -> None:
    job = sa.table("jodl_job", sa.column("state", sa.String()), sa.column("due_at", sa.DateTime()))
    op.execute(
        job.update().where(job.c.state == "idle", job.c.due_at.is_not(None)).values(due_at=None)
    )
    op.create_index(
        "ix_jodl_job_idle_due",
        "jodl_job",
        ["family_id", "due_at"],
        unique=False,
        postgresql_where=sa.text(IDLE_DUE),
        sqlite_where=sa.text(IDLE_DUE),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_jodl_job_idle_due",
        table_name="jodl_job",
        postgresql_where=sa.text(IDLE_DUE),
        sqlite_where=sa.text(IDLE_DUE),
    )
    # Idle jobs' due times mean nothing before this revision: none is left to hold a
    # job back once upgraded again.
    job = sa.table("jodl_job", sa.column("state", sa.String()), sa.column("due_at", sa.DateTime()))
    op.execute(
        job.update().where(job.c.state == "idle", job.c.due_at.is_not(None)).values(due_at=None)
    )
