"""`gluejobs worker` / `python -m worker`: migrate the database, then claim and run jobs."""

from __future__ import annotations

import argparse

from shared.config import get_settings
from shared.db import Database
from shared.migrate import upgrade


def parser(prog: str = "gluejobs worker") -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        prog=prog, description="Claim and run jobs (migrates the database first)."
    )
    result.add_argument("--exit-when-idle", action="store_true", help="drain the queue, then exit")
    result.add_argument("--max-jobs", type=int, default=None, help="exit after this many jobs")
    return result


def main(argv: list[str] | None = None, *, prog: str = "gluejobs worker") -> int:
    from worker.runner import Worker

    args = parser(prog).parse_args(argv)
    settings = get_settings()
    db = Database(settings.database_url)
    upgrade(db)
    worker = Worker(settings, db)
    worker.install_signal_handlers()
    worker.run(exit_when_idle=args.exit_when_idle, max_jobs=args.max_jobs)
    return 0
