"""Change detection on a noisy corpus: false alerts, missed edits, delay, cost.

The corpus of tests/corpus.py (random variants per request, states that hold for
two fetches, a 200 maintenance page, CDN edges with a 304, per-request noise with
real edits) is served by a local site; the page checker runs its real cycles
(one agent subprocess, a master in this process, an SMTP sink) for ``--cycles``
cycles and each of ``--seeds`` seeds. Printed: false alerts, missed edits, delay
from an edit to its digest (cycles and seconds), fetches per page per cycle (also
without the first cycle, where each new page's baseline takes two fetches); the
last line is one JSON object. ``--smoke`` runs one seed over 8 cycles.

    python bench/detection.py [--seeds 3] [--cycles 10] [--db URL] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import SECRET, agents, free_port, fresh_database  # noqa: E402


def one_seed(db_url: str, seed: int, cycles: int, confirm_delay: float) -> dict[str, object]:
    from aiosmtpd.controller import Controller

    from crawler_app.checking.cycle import PageCycle
    from crawler_app.settings import AppSettings
    from jodl import Master, Settings, Store, make_engine
    from jodl.log.migrate import upgrade
    from tests.corpus import Corpus, run_corpus, track_corpus
    from tests.site import TestSite

    class Sink:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
            return "250 OK"

    smtp = Controller(Sink(), hostname="127.0.0.1", port=free_port())
    smtp.start()
    engine = make_engine(db_url)
    env = {
        "JODL_FETCH_ALLOW": "127.0.0.0/8",
        "JODL_FETCH_HOST_INTERVAL": "0",
        "JODL_FETCH_HOST_IN_FLIGHT": "8",
        "JODL_CONFIRM_DELAY": str(confirm_delay),
        "JODL_SMTP_HOST": "127.0.0.1",
        "JODL_SMTP_PORT": str(smtp.port),
        "JODL_DATABASE_URL": db_url,
    }
    try:
        upgrade(engine)
        store = Store(engine)
        with TestSite() as site, agents(1, slots=8, env=env) as addresses:
            corpus = Corpus(site, seed)
            track_corpus(engine, corpus)
            store.add_node(addresses[0], slots=8)
            settings = Settings(database_url=db_url, log_level="WARNING", secret=SECRET)
            app = AppSettings.from_env(
                env={}, check_spread=0.0, mail_from="j@example.org", fetch_allow_users=("*",)
            )

            def run_cycle():  # type: ignore[no-untyped-def]
                master = Master(settings, store=store)
                try:
                    return PageCycle(engine, master.run_cycle, app).run()
                finally:
                    master.close()

            outcome = run_corpus(engine, corpus, run_cycle, cycles)
    finally:
        smtp.stop()
        engine.dispose()
    return {
        "seed": seed,
        "false_alerts": outcome.false_alerts,
        "missed_edits": outcome.missed_edits,
        "delays": outcome.delays,
        "seconds": outcome.seconds,
        "fetches_per_page_cycle": round(outcome.fetches_per_page_cycle, 3),
        "fetches_per_page_later_cycle": round(outcome.fetches_per_page_later_cycle, 3),
    }


def mean_of(runs: list[dict[str, object]], key: str) -> float:
    return round(sum(float(run[key]) for run in runs) / len(runs), 3)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="corpus seeds (default 3)")
    parser.add_argument("--cycles", type=int, default=10, help="cycles per seed (default 10)")
    parser.add_argument("--db", default="sqlite://", help="database server URL (default SQLite)")
    parser.add_argument("--confirm-delay", type=float, default=0.05, help="JODL_CONFIRM_DELAY")
    parser.add_argument("--smoke", action="store_true", help="one seed, 8 cycles (CI)")
    args = parser.parse_args()
    seeds, cycles = (1, 8) if args.smoke else (args.seeds, args.cycles)
    runs = []
    for seed in range(1, seeds + 1):
        with fresh_database(args.db) as url:
            run = one_seed(url, seed, cycles, args.confirm_delay)
        runs.append(run)
        print(
            f"seed {seed}: {len(run['false_alerts'])} false alerts {run['false_alerts']}, "
            f"{len(run['missed_edits'])} missed edits {run['missed_edits']}, "
            f"delay (cycles) {run['delays']}, edit to digest (s) {run['seconds']}, "
            f"{run['fetches_per_page_cycle']} fetches per page per cycle "
            f"({run['fetches_per_page_later_cycle']} after the baselines' cycle)"
        )
    delays = [d for run in runs for d in run["delays"].values()]  # type: ignore[attr-defined]
    seconds = [s for run in runs for s in run["seconds"].values()]  # type: ignore[attr-defined]
    figures = {
        "false_alerts": sum(len(run["false_alerts"]) for run in runs),  # type: ignore[arg-type]
        "missed_edits": sum(len(run["missed_edits"]) for run in runs),  # type: ignore[arg-type]
        "max_delay_cycles": max(delays, default=0),
        "max_delay_seconds": max(seconds, default=0.0),
        "fetches_per_page_cycle": mean_of(runs, "fetches_per_page_cycle"),
        "fetches_per_page_later_cycle": mean_of(runs, "fetches_per_page_later_cycle"),
        "seeds": seeds,
        "cycles": cycles,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
