"""Notifying: digests of the changes found, by e-mail, to channels and as Atom feeds.

``digests`` (one per user per cycle, with its idempotency key), ``mail`` (the digest
e-mails, from the package's templates), ``channels`` (notification channels through
Apprise) and ``feeds`` (Atom feeds at secret-token URLs).
"""
