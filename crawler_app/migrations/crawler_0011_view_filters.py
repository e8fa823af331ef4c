"""page checker: filters and triggers per tracking, several views of a page per user

A view's key (``selector`` in ``app_tracking``, ``app_page_view``, ``app_snapshot``)
now holds a CSS selector, an XPath or JSONPath expression, or a view's filters as
JSON (crawler_app.fetching.filters): widened to 1000 characters. A user may track one page
through several views: the unique constraint on ``app_tracking`` takes the view,
and a whole-page tracking's key is ``''`` (NULL before). ``app_page_view.problem``
says why a view's last good fetch gave it no text.

Revision ID: crawler_0011
Revises: crawler_0010
Create Date: 2026-11-26 17:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "crawler_0011"
down_revision = "crawler_0010"
branch_labels = None
depends_on = None

_TABLES = ("app_tracking", "app_page_view", "app_snapshot")


def upgrade() -> None:
    op.execute("UPDATE app_tracking SET selector = '' WHERE selector IS NULL")
    with op.batch_alter_table("app_tracking") as batch:
        batch.drop_constraint("uq_app_tracking_user_page", type_="unique")
        batch.alter_column(
            "selector", existing_type=sa.String(500), type_=sa.String(1000), nullable=True
        )
        batch.create_unique_constraint(
            "uq_app_tracking_user_page_view", ["user_id", "page_id", "selector"]
        )
    for table in _TABLES[1:]:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                "selector", existing_type=sa.String(500), type_=sa.String(1000), nullable=False
            )
    with op.batch_alter_table("app_page_view") as batch:
        batch.add_column(sa.Column("problem", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("app_page_view") as batch:
        batch.drop_column("problem")
    # One tracking per user and page again: the oldest of each user's views stays.
    op.execute(
        "DELETE FROM app_tracking WHERE id NOT IN (SELECT min(id) FROM app_tracking "
        "GROUP BY user_id, page_id)"
    )
    op.execute("DELETE FROM app_page_view WHERE length(selector) > 500")
    op.execute("DELETE FROM app_snapshot WHERE length(selector) > 500")
    op.execute("UPDATE app_tracking SET selector = NULL WHERE length(selector) > 500")
    for table in _TABLES[1:]:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                "selector", existing_type=sa.String(1000), type_=sa.String(500), nullable=False
            )
    with op.batch_alter_table("app_tracking") as batch:
        batch.drop_constraint("uq_app_tracking_user_page_view", type_="unique")
        batch.alter_column(
            "selector", existing_type=sa.String(1000), type_=sa.String(500), nullable=True
        )
        batch.create_unique_constraint("uq_app_tracking_user_page", ["user_id", "page_id"])
