"""page checker: check_page jobs of one host share one agent

Existing ``check_page`` families still on the default strategy move to the
``affinity`` strategy by host, so a host's politeness limits hold across the
cluster. A family whose strategy an operator changed is left alone.

Revision ID: crawler_0004
Revises: crawler_0003
Create Date: 2026-11-21 13:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0004"
down_revision = "crawler_0003"
branch_labels = None
depends_on = None
#: The revision of the single history before the split that this one was part of
#: (an old database stamped there is adopted by :mod:`jodl.log.migrate`).
legacy = "0006"

family = sa.table(
    "jodl_family",
    sa.column("name", sa.String),
    sa.column("strategy", sa.String),
    sa.column("strategy_params", sa.JSON),
)


def upgrade() -> None:
    op.execute(
        family.update()
        .where(family.c.name == "check_page", family.c.strategy == "earliest_finish")
        .values(strategy="affinity", strategy_params={"by": "host"})
    )


def downgrade() -> None:
    op.execute(
        family.update()
        .where(family.c.name == "check_page", family.c.strategy == "affinity")
        .values(strategy="earliest_finish", strategy_params={})
    )
