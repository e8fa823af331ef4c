"""Tables of the web UI: submitted batches of URLs and resets of the result cache.

A batch is kept in the database, not in the web process, so its event stream can
be resumed by any web process and after a restart. Each item remembers where its
answer comes from: refused at submission (``error``), answered from the cache
(``cached_exec_id``), or the first ``done`` execution of its on-demand job with an
id above ``after_exec_id`` (execution ids of one job only grow).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from jodl.log import Base, BigId, utcnow

#: Longest submitted URL text kept with an item (longer ones are refused anyway).
ITEM_URL_LENGTH = 2100


class Batch(Base):
    """One submission of URLs."""

    __tablename__ = "web_batch"
    __table_args__ = (
        Index("ix_web_batch_created", "created_at"),
        # the URLs a user submitted in the last 24 hours (web/quota.py)
        Index("ix_web_batch_user_created", "user_id", "created_at"),
    )
    #: Random, unguessable: knowing the id is what lets someone watch the batch.
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("app_user.id", ondelete="SET NULL"))
    size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class BatchItem(Base):
    """One URL of a batch and where its answer comes from."""

    __tablename__ = "web_batch_item"
    batch_id: Mapped[str] = mapped_column(
        ForeignKey("web_batch.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    #: The normalised URL (or the submitted text, cut, when it was refused).
    url: Mapped[str] = mapped_column(String(ITEM_URL_LENGTH))
    #: Why the URL was refused at submission; None when it was accepted.
    error: Mapped[str | None] = mapped_column(Text)
    #: The on-demand ``check_page`` job answering it (no foreign key, as in the log).
    job_id: Mapped[int | None] = mapped_column(BigId)
    #: Answered from the cache by this execution.
    cached_exec_id: Mapped[int | None] = mapped_column(BigId)
    #: Otherwise answered by the job's first done execution with a greater id.
    after_exec_id: Mapped[int] = mapped_column(BigId, default=0)
    #: Fingerprint of the URL's previous result, to tell whether it changed.
    previous_fingerprint: Mapped[str | None] = mapped_column(String(64))


class CacheReset(Base):
    """Results of a job up to ``floor_exec_id`` are forgotten by the cache."""

    __tablename__ = "web_cache_reset"
    job_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    floor_exec_id: Mapped[int] = mapped_column(BigId)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("app_user.id", ondelete="SET NULL"))
    reset_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
