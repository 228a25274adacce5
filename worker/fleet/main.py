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
from worker.fleet.health import Warming

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
    from worker.fleet.runner import Worker


def main(argv: list[str] | None = None, *, prog: str = "gluejobs worker") -> int:
    from worker.fleet.devices import DeviceError, DeviceLocks, resolve_devices
    from worker.fleet.runner import Worker

    args = parser(prog).parse_args(argv)
    settings = get_settings()
    locks = DeviceLocks(settings.device_lock_dir)
    try:
        wanted = resolve_devices(args.devices, args.slots)
        devices = locks.acquire(wanted, all_or_error=args.devices is not None)
    except DeviceError as exc:
        raise SystemExit(f"{prog}: {exc.message}") from None
    health = None
    warming = Warming("the database's schema")
    try:
        db = Database(settings.database_url)
        worker = Worker(settings, db, devices=devices)
        worker.install_signal_handlers()
        if args.health_port is not None:
            from worker.fleet.health import HealthServer

            health = HealthServer(
                args.health_port,
                worker.status,
                host=args.health_host,
                database=worker.database,
                warming=warming,
            ).start()
        try:
            if not _migrate(db, worker, check_only=args.no_migrate):
                return 0  # stopped while waiting for the database
        except release.ReleaseMismatch as exc:
            raise SystemExit(f"{prog}: {exc}") from None  # one line, no traceback
        if worker.warm is not None:
            # Once the release fits (else no template at all); its imports overlap the store's check.
            worker.warm.start()
        warming.now("the store")
        open_store(settings).check()  # the store's bucket or folder, made when missing
        warming.now("the warm-start template")
        if not _wait_for_template(worker):
            return 0  # stopped while the template loaded
        warming.now(None)
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
            with worker.database.round_trip():  # /readyz: the database answered, or did not
                _migrate_once(db, check_only=check_only)
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


def _migrate_once(db: Database, *, check_only: bool) -> None:
    if check_only:
        with db.engine.connect() as connection:
            release.check(connection)
    else:
        upgrade(db)


def _wait_for_template(worker: Worker) -> bool:
    """Wait for the warm-start template's imports (seconds; about 45 s on a loaded machine) before
    the loop claims, with a round trip to the database every poll interval meanwhile, so that
    /readyz tells an outage during the wait as it would later; False when stopped meanwhile."""
    if worker.warm is None:
        return True
    interval_s = worker.settings.poll_interval_s
    reached = True
    while not worker.warm.wait_ready(interval_s):
        if worker.stopping:
            return False
        if reached != (reached := worker.database.probe()):  # one line as it goes, one as it comes back
            logger.warning(
                "the database is %s while the warm-start template loads",
                "reachable again" if reached else "unreachable",
            )
    return not worker.stopping
