"""The digests' claims in the shared database: the ``notify`` family's SQL, on the agents.

:class:`Journal` is the gateway of :class:`~crawler_app.models.DigestClaim` (and of
the one read of a channel's URL) for :class:`crawler_app.checking.families.Notify`,
which builds no SQL of its own.
"""

from __future__ import annotations

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from jodl.log import utcnow

from ..models import DigestClaim, DigestClaimState, UserChannel


class Journal:
    """The digests' claims, by idempotency key, in the shared database (:class:`DigestClaim`).

    A claim is one row, inserted once the SMTP server greeted us and right before the
    message is handed over (MAIL, RCPT, DATA): the primary key makes
    the first inserter the only sender, whichever agent it runs on, across agent
    restarts and ``jodl up``. The row says ``sent`` once the server accepted the mail;
    it is deleted when the server accepted nothing, so a retry may send it.

    A crash between the claim and the server's answer to DATA leaves ``sending``:
    the digest is then **not** sent again (at most once). The server may or may not
    have it, and a second copy is the fault users see and report; a missing digest
    shows as failed in the UI and the next digest lists the later changes.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def claim(self, key: str, message_id: str, node: str) -> str | None:
        """Take the claim on ``key``: None when taken, else the state found there."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(DigestClaim).values(
                        idem_key=key,
                        message_id=message_id,
                        state=DigestClaimState.SENDING,
                        node=node,
                        claimed_at=utcnow(),
                    )
                )
        except IntegrityError:
            with self.engine.connect() as conn:
                state = conn.scalar(select(DigestClaim.state).where(DigestClaim.idem_key == key))
            return state or DigestClaimState.SENDING
        return None

    def state(self, key: str) -> str | None:
        """``sending``, ``sent`` or None (not claimed)."""
        with self.engine.connect() as conn:
            return conn.scalar(select(DigestClaim.state).where(DigestClaim.idem_key == key))

    def sent(self, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(DigestClaim)
                .where(DigestClaim.idem_key == key)
                .values(state=DigestClaimState.SENT, sent_at=utcnow())
            )

    def release(self, key: str) -> None:
        """Nothing went out: free the key for a retry."""
        with self.engine.begin() as conn:
            conn.execute(delete(DigestClaim).where(DigestClaim.idem_key == key))

    def channel_url(self, channel_id: int) -> str | None:
        """The Apprise URL of a channel (None once its user removed it)."""
        with self.engine.connect() as conn:
            return conn.scalar(select(UserChannel.url).where(UserChannel.id == channel_id))
