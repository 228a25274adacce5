"""Claim-to-first-step benchmark: how long a small job waits between its claim and its first
optimizer step, with the warm start off (a fresh interpreter per job) and on (forked from the
worker's template process).

    python bench/warm_start_bench.py                  # 20 jobs per mode, a tiny BERT, SQLite
    python bench/warm_start_bench.py --model minilm --torch-threads 1
    python bench/warm_start_bench.py --jobs 5 --database-url postgresql+psycopg://postgres@127.0.0.1/test

The jobs are small (SST-2's first 32 rows, batch 16, 2 steps; a 2-layer, 32-wide BERT over
MiniLM's vocabulary, or MiniLM itself with --model minilm) and their data is already tokenised
(a first job, not counted, fills the tokenisation cache). For each mode one worker process drains
the queue; a warm-up job (not counted) lets the worker and its template start first. Per job:
the claim is the "claimed by worker" event's time and the first step is the step-1 training
metric's time (logging_steps 1), both as the database stored them. The phases between them come
from the job's events. Load average is printed beside the figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import select  # noqa: E402

from bench.harness import QUICK_JOB, bench_settings, percentile, run_folder, save_tiny_bert  # noqa: E402
from gluejobs_server.demo import MODEL_NAME, install_demo_files  # noqa: E402
from gluejobs_server.stack import local_stack, stack_environment  # noqa: E402
from shared import jobs_repo  # noqa: E402
from shared.core.config import Settings  # noqa: E402
from shared.core.db import Database, read  # noqa: E402
from shared.core.migrate import upgrade  # noqa: E402
from shared.core.tables import JobEvent, JobMetric  # noqa: E402

SPEC: dict[str, Any] = {**QUICK_JOB, "logging_steps": 1}
# Events of a job, in the order its child reaches them: (label, how the message starts).
PHASES = (("data ready", "data:"), ("model built", "parameters:"), ("loop starts", "training:"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20, help="jobs per mode (default 20)")
    parser.add_argument("--database-url", default=None, help="default: a SQLite file in the run's folder")
    parser.add_argument("--modes", default="off,on", help="warm start modes to run, in order")
    parser.add_argument("--model", choices=("tiny", "minilm"), default="tiny")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="OMP_NUM_THREADS for the jobs (default: torch's own)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    args = parser.parse_args()

    with run_folder("gluejobs-warm-bench-", keep=args.keep) as root:
        settings = bench_settings(
            root,
            database_url=args.database_url,
            heartbeat_s=2.0,
            poll_interval_s=0.2,
            device_lock_dir=root / "locks",
        )
        install_demo_files(settings)
        model = MODEL_NAME
        if args.model == "tiny":
            model = save_tiny_bert(settings.models_dir / "tiny-bert", settings.models_dir / MODEL_NAME).name
        spec = {**SPEC, "model_name_or_path": model}
        env = stack_environment(settings, HF_HUB_OFFLINE="1")
        if args.torch_threads is not None:
            env["OMP_NUM_THREADS"] = str(args.torch_threads)
        db = Database(settings.database_url)
        upgrade(db)
        report: dict[str, Any] = {
            "jobs_per_mode": args.jobs,
            "spec": spec,
            "torch_threads": args.torch_threads or "default",
            "cpus": os.cpu_count(),
        }
        try:
            for mode in args.modes.split(","):
                report[f"warm_start_{mode}"] = run_mode(
                    settings, db, spec, env, root, mode == "on", args.jobs
                )
        finally:
            db.dispose()
    print(json.dumps(report, indent=2))
    return 0


def run_mode(
    settings: Settings,
    db: Database,
    spec: dict[str, Any],
    env: dict[str, str],
    root: Path,
    warm: bool,
    jobs: int,
) -> dict[str, Any]:
    env = {**env, "GLUEJOBS_WARM_START": str(warm).lower()}
    logs = root / f"logs-warm-{'on' if warm else 'off'}"
    with local_stack(
        settings, logs=logs, api=False, worker_args=("--slots", "1"), env=env, migrate=False
    ) as stack:
        worker, log = stack.workers[0], logs / "worker-0.log"
        # Not counted: fills the tokenisation cache, starts the worker (and its template).
        drain(db, worker, [submit(db, spec, seed=0)], log)
        load_before = os.getloadavg()
        ids = [submit(db, spec, seed=i + 1) for i in range(jobs)]
        started = time.monotonic()
        drain(db, worker, ids, log)
        wall_s = time.monotonic() - started
        load_after = os.getloadavg()
    timings = [claim_to_first_step(db, job_id) for job_id in ids]
    waits = [t["first step"] for t in timings]
    return {
        "claim_to_first_step_s": {
            "median": round(statistics.median(waits), 3),
            "p90": percentile(waits, 0.9),
            "min": round(min(waits), 3),
            "max": round(max(waits), 3),
        },
        "phases_median_s": {
            label: round(statistics.median(t[label] for t in timings), 3) for label in timings[0]
        },
        "wall_s": round(wall_s, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }


def submit(db: Database, spec: dict[str, Any], *, seed: int) -> int:
    with db.session() as session:
        return jobs_repo.create_job(session, spec={**spec, "seed": seed}, max_attempts=1).id


def drain(db: Database, worker: subprocess.Popen[bytes], ids: list[int], log: Path) -> None:
    deadline = time.monotonic() + 120 + 60 * len(ids)
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited: see {log}")
        with db.session() as session:
            jobs = [jobs_repo.get_job(session, job_id=i) for i in ids]
        if all(j.status.is_terminal for j in jobs):
            failed = [j for j in jobs if j.status != "succeeded"]
            if failed:
                raise SystemExit(f"job {failed[0].id} {failed[0].status}: {failed[0].error}")
            return
        time.sleep(0.5)
    raise SystemExit(f"the jobs did not finish in time: see {log}")


def claim_to_first_step(db: Database, job_id: int) -> dict[str, float]:
    """Seconds from the claim to each phase and to the first step's metric."""
    with db.session() as session, read(session):
        events = list(
            session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
        )
        first_step = session.scalars(
            select(JobMetric.created_at).where(
                JobMetric.job_id == job_id, JobMetric.split == "train", JobMetric.step == 1
            )
        ).first()
    claimed = next(e.created_at for e in events if e.message.startswith("claimed by worker"))
    assert first_step is not None, f"job {job_id} logged no step-1 metric"

    def since_claim(moment: datetime) -> float:
        return (moment - claimed).total_seconds()

    timings = {
        label: since_claim(next(e.created_at for e in events if e.message.startswith(prefix)))
        for label, prefix in PHASES
    }
    timings["first step"] = since_claim(first_step)
    return timings


if __name__ == "__main__":
    sys.exit(main())
