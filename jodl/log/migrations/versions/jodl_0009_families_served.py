"""families agents serve: a run's reason its jobs wait, a node's asked reload, and
the family class as the source of ``idempotent``

``jodl_run.unserved`` says, while no live agent can run a run's family, why (e.g.
"no agent serves wordcount: installed on 0 of 2 agents"); NULL once one can.
``jodl_node.reload_asked_at`` is set by ``jodl node reload`` (or the web UI) until
the running master has relayed the reload to the node's agent.
``jodl_family.idempotent`` becomes an override: NULL follows what the family class
declares (``Family.idempotent``); the old default false becomes NULL, true stays.

Revision ID: jodl_0009
Revises: jodl_0008
Create Date: 2026-11-23 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "jodl_0009"
down_revision = "jodl_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jodl_run") as batch:
        batch.add_column(sa.Column("unserved", sa.Text(), nullable=True))
    with op.batch_alter_table("jodl_node") as batch:
        batch.add_column(sa.Column("reload_asked_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("jodl_family") as batch:
        batch.alter_column("idempotent", existing_type=sa.Boolean(), nullable=True)
    family = sa.table("jodl_family", sa.column("idempotent", sa.Boolean()))
    op.execute(family.update().where(family.c.idempotent.is_(False)).values(idempotent=None))


def downgrade() -> None:
    family = sa.table("jodl_family", sa.column("idempotent", sa.Boolean()))
    op.execute(family.update().where(family.c.idempotent.is_(None)).values(idempotent=False))
    with op.batch_alter_table("jodl_family") as batch:
        batch.alter_column("idempotent", existing_type=sa.Boolean(), nullable=False)
    with op.batch_alter_table("jodl_node") as batch:
        batch.drop_column("reload_asked_at")
    with op.batch_alter_table("jodl_run") as batch:
        batch.drop_column("unserved")
