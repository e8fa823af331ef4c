"""Users and what they track: ``pages`` (users, pages, trackings and the jobs behind
them) and ``quota`` (per-user limits)."""
