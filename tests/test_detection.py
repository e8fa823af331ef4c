"""The noisy corpus (tests/corpus.py) through real cycles: no false alert, no missed edit,
every edit mailed in the cycle that first sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app_support import agent_env, app_settings, inbox, run_app_cycle

from tests.corpus import EDITS, Corpus, run_corpus, track_corpus

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest

CYCLES = 8


def test_the_noisy_corpus_alerts_exactly_its_edits_in_their_cycle(
    store, agents, settings, site: TestSite, inbox
):
    corpus = Corpus(site, seed=1)
    track_corpus(store.engine, corpus)
    agents(1, env=agent_env(inbox))
    app = app_settings()
    outcome = run_corpus(store.engine, corpus, lambda: run_app_cycle(store, settings, app), CYCLES)

    assert outcome.false_alerts == []
    assert outcome.missed_edits == []
    assert outcome.delays == dict.fromkeys(EDITS, 0)
    # One digest per edited page, to its own tracker, and none to anyone else.
    assert {r: n for r, n in inbox.per_recipient().items()} == {
        f"{path.strip('/')}@example.org": 1 for path in EDITS
    }
    # The maintenance page served with 200 on cycles 4 and 5 was an error, not content.
    assert outcome.errors.get("/maintenance") == [4, 5]
