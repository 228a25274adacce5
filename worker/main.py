"""`gluejobs worker` / `python -m worker`: migrate the database, then claim and run jobs."""

from __future__ import annotations

import argparse
import logging

from shared.config import get_settings
from shared.db import Database
from shared.migrate import upgrade

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
        "--slots",
        type=int,
        default=None,
        help="on the CPU: how many job processes run at once (default 1)",
    )
    return result


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
    try:
        db = Database(settings.database_url)
        upgrade(db)
        worker = Worker(settings, db, devices=devices)
        worker.install_signal_handlers()
        worker.run(exit_when_idle=args.exit_when_idle, max_jobs=args.max_jobs)
    finally:
        locks.release()
    return 0
