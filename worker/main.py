"""`gluejobs worker` / `python -m worker`: migrate the database, then claim and run jobs."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from shared.core import release
from shared.core.config import get_settings
from shared.core.db import Database
from shared.core.migrate import upgrade
from shared.core.storage import open_store

logger = logging.getLogger(__name__)


def parser(prog: str = "gluejobs worker") -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        prog=prog, description="Claim and run jobs (migrates the database first)."
    )
    result.add_argument("--exit-when-idle", action="store_true", help="drain the queue, then exit")
    result.add_argument("--max-jobs", type=int, default=None, help="exit after this many jobs")
    result.add_argument(
        "--devices",
        default=None,
        help="GPUs to run on, as CUDA names them (0,1,3 or GPU-… UUIDs), or `cpu`; default: every "
        "visible GPU, else the CPU. One job process per GPU; a job with num_processes N needs N free",
    )
    result.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="serve GET /healthz (alive) and /readyz (503 while waiting for the database) on this port",
    )
    result.add_argument("--health-host", default="0.0.0.0", help="the health port's address (default all)")
    result.add_argument(
        "--no-migrate",
        action="store_true",
        help="leave the schema as it is (run `gluejobs migrate` yourself); refuse to work unless it fits",
    )
    result.add_argument(
        "--slots",
        type=int,
        default=None,
        help="on the CPU: how many job processes run at once (default 1)",
    )
    return result


if TYPE_CHECKING:
    from worker.runner import Worker


def main(argv: list[str] | None = None, *, prog: str = "gluejobs worker") -> int:
    from worker.devices import DeviceError, DeviceLocks, resolve_devices
    from worker.runner import Worker

    args = parser(prog).parse_args(argv)
    settings = get_settings()
    locks = DeviceLocks(settings.device_lock_dir)
    try:
        wanted = resolve_devices(args.devices, args.slots)
        devices = locks.acquire(wanted, all_or_error=args.devices is not None)
    except DeviceError as exc:
        raise SystemExit(f"{prog}: {exc.message}") from None
    health = None
    try:
        db = Database(settings.database_url)
        worker = Worker(settings, db, devices=devices)
        worker.install_signal_handlers()
        if args.health_port is not None:
            from worker.health import HealthServer

            health = HealthServer(args.health_port, worker.status, host=args.health_host).start()
        try:
            if not _migrate(db, worker, check_only=args.no_migrate):
                return 0  # stopped while waiting for the database
        except release.ReleaseMismatch as exc:
            raise SystemExit(f"{prog}: {exc}") from None  # one line, no traceback
        open_store(settings).check()  # the store's bucket or folder, made when missing
        worker.run(exit_when_idle=args.exit_when_idle, max_jobs=args.max_jobs)
        if worker.refusal is not None:
            return 3  # stopped claiming: the database needs another release (logged once)
    finally:
        if health is not None:
            health.stop()
        locks.release()
    return 0


def _migrate(db: Database, worker: Worker, *, check_only: bool = False) -> bool:
    """Bring the schema up to date (with check_only: see that this release fits it), waiting for the
    database as long as it takes (a fleet that starts before its database, or during a failover, waits
    instead of exiting); False when the worker was stopped meanwhile. A release that does not fit the
    database raises release.ReleaseMismatch."""
    from shared.core.db_retries import Backoff, is_transient

    backoff = Backoff(base_s=0.5, cap_s=30.0)
    while not worker.stopping:
        try:
            if check_only:
                with db.engine.connect() as connection:
                    release.check(connection)
            else:
                upgrade(db)
            return True
        except Exception as exc:
            if not is_transient(exc):
                raise
            delay = backoff.next_delay()
            logger.warning(
                "the database is unreachable; retrying in %.1fs: %s", delay, str(exc).splitlines()[0]
            )
            worker.wait_stopping(delay)
    return False
