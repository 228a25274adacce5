"""The child process that runs one job: `python -m worker.child --job-id N --worker-id W`.

Started by the runner (or by `accelerate launch` for several processes), so that a crash, an
out-of-memory kill or a cancel cannot take the worker down, and GPU memory goes back between jobs.
The main process writes metrics, checkpoints and events to the database as they happen; on failure
every process leaves its error in a file the runner reads to say why the job failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from shared import jobs_repo
from shared.config import get_settings
from shared.db import Database
from shared.errors import GluejobsError
from shared.jobs_repo import MetricRow
from shared.spec import JobSpec
from worker.checkpoints import newest_checkpoint
from worker.environment import record_environment
from worker.outcome import error_file

logger = logging.getLogger("worker.child")


class DatabaseReporter:
    """The training loop's Reporter: every call is one short transaction."""

    def __init__(self, db: Database, job_id: int) -> None:
        self.db = db
        self.job_id = job_id

    def log(self, message: str, *, level: str = "info", data: dict[str, Any] | None = None) -> None:
        with self.db.session() as session:
            jobs_repo.add_event(session, job_id=self.job_id, message=message, level=level, data=data)

    def metrics(
        self, *, step: int, epoch: float, split: str, values: dict[str, float], best_metric: str | None = None
    ) -> None:
        rows = [MetricRow(epoch=epoch, step=step, split=split, name=k, value=v) for k, v in values.items()]
        with self.db.session() as session:
            jobs_repo.add_metrics(session, job_id=self.job_id, rows=rows, best_metric=best_metric)

    def checkpoint(
        self, *, step: int, epoch: float, path: str, metrics: dict[str, float], is_best: bool
    ) -> None:
        with self.db.session() as session:
            jobs_repo.add_checkpoint(
                session,
                job_id=self.job_id,
                step=step,
                epoch=epoch,
                path=path,
                metrics=metrics,
                is_best=is_best,
            )

    def checkpoints_deleted(self, steps: list[int]) -> None:
        with self.db.session() as session:
            jobs_repo.delete_checkpoints(session, job_id=self.job_id, steps=steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.child")
    parser.add_argument("--job-id", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s [job {args.job_id}] %(name)s: %(message)s"
    )
    rank = int(os.environ.get("RANK", "0"))
    settings = get_settings()
    db = Database(settings.database_url)
    output_dir: Path | None = None
    try:
        with db.session() as session:
            job = jobs_repo.get_job(session, job_id=args.job_id)
        assert job.output_dir, "the runner sets output_dir before it starts the child"
        output_dir = Path(job.output_dir)
        spec = JobSpec.model_validate(job.spec)
        if rank == 0:
            record_environment(db, job, settings)  # versions, device, data and weight hashes
        resume_from = newest_checkpoint(output_dir / "checkpoints")
        # Imported here so that a broken torch install fails the job with its message, not the import.
        from worker.training import run_training

        result = run_training(
            spec,
            settings,
            output_dir=output_dir,
            reporter=DatabaseReporter(db, args.job_id),
            resume_from=resume_from,
        )
        if rank == 0:
            with db.session() as session:
                jobs_repo.set_result(session, job_id=args.job_id, result=result)
        return 0
    except BaseException as exc:  # the runner must learn why, whatever it was
        message = exc.message if isinstance(exc, GluejobsError) else f"{type(exc).__name__}: {exc}"
        logger.error("job %s failed: %s\n%s", args.job_id, message, traceback.format_exc())
        if output_dir is not None:
            error_file(output_dir, rank).write_text(message)
        return 1
    finally:
        db.dispose()


if __name__ == "__main__":
    sys.exit(main())
