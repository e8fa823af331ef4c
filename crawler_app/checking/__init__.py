"""Checking: the cycle that fetches every tracked page and detects real changes.

``cycle`` (the recorded state machine) with ``cycle_requests`` (cycles asked through
the database), ``schedule`` (scheduled cycles beside a master) and ``due`` (trackings'
schedules); ``families`` (the ``check_page`` and ``notify`` job families the agents
run) and ``check_result`` (the typed result of ``check_page``); ``confirm``,
``variance`` and ``change`` (the change-detection rule, docs/change-detection.md);
``analysis`` (results stored as verdicts) and ``baselines`` (taken at once for new
trackings).
"""
