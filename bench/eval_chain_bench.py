"""Evaluation jobs and chained jobs, from their claim (issue 33's benchmarks).

    python bench/eval_chain_bench.py                  # 5 rounds, a tiny BERT, SQLite, one worker
    python bench/eval_chain_bench.py --rounds 10 --eval-rows 512

One API and one worker (gluejobs_server/stack.py's local_stack; one slot, the warm start as configured,
on by default), no keys. A source job trains the tiny BERT on SST-2's first 32 rows and is promoted
to `model:bench-source` (the same bytes: the store writes a manifest, no copy). Then, per round, in
this order, four jobs:

- eval: an evaluation job (do_train false, do_eval) of `job:SOURCE` on SST-2's first --eval-rows
  validation rows: claim -> its evaluation row, and the evaluation's own time (its "no training"
  event, the model loaded -> its evaluation row) and the batches' time as the job measured it;
- train: the source job's spec again (2 optimizer steps, then the same evaluation on the same rows
  at the end of training): claim -> that evaluation row, and the evaluation's own time (its last
  training row -> its evaluation row);
- job: a training job starting from `job:SOURCE` (logging_steps 1): claim -> its first step's row;
- model: the same from `model:bench-source`: claim -> its first step's row.

The claim is the "claimed by worker" event's time, the rows' times are the database's own
(created_at). A warm-up job (not counted) starts the worker (and its template) and fills the
tokenisation cache; the source model's files are in the worker's model cache after the first
chained job (both names are the same bytes, so they share it). The CPU model (lscpu) and the load
average are printed beside the figures: the machine may be shared.
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

import httpx  # noqa: E402
from sqlalchemy import select  # noqa: E402

from bench.harness import QUICK_JOB, bench_settings, load_average, percentile, run_folder, save_tiny_bert  # noqa: E402
from gluejobs_server.demo import demo_model_folder, install_demo_files  # noqa: E402
from gluejobs_server.stack import local_stack, stack_environment  # noqa: E402
from shared.core.db import Database, read  # noqa: E402
from shared.core.tables import JobEvent, JobMetric  # noqa: E402

KINDS = ("eval", "train", "job", "model")
PROMOTED = "bench-source"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the four jobs (default 5)")
    parser.add_argument("--eval-rows", type=int, default=256, help="validation rows evaluated (default 256)")
    parser.add_argument("--database-url", default=None, help="default: a SQLite file in the run's folder")
    parser.add_argument("--warm-start", choices=("on", "off"), default="on")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    args = parser.parse_args()

    with run_folder("gluejobs-eval-chain-bench-", keep=args.keep) as root:
        settings = bench_settings(root, database_url=args.database_url, heartbeat_s=2.0, poll_interval_s=0.2)
        install_demo_files(settings)
        tiny = save_tiny_bert(settings.models_dir / "tiny-bert", demo_model_folder(settings)).name
        source = {
            **QUICK_JOB,
            "model_name_or_path": tiny,
            "max_eval_samples": args.eval_rows,
            "per_device_eval_batch_size": 32,
            "do_eval": True,  # one evaluation, at the end of training
            "learning_rate": 1e-3,
        }
        env = stack_environment(
            settings, HF_HUB_OFFLINE="1", GLUEJOBS_WARM_START=str(args.warm_start == "on").lower()
        )
        db = Database(settings.database_url)
        load_before = load_average()
        stack_of = local_stack(settings, logs=root / "logs", worker_args=("--slots", "1"), env=env)
        with stack_of as stack, httpx.Client(base_url=stack.url, timeout=60) as client:
            worker, log = stack.workers[0], root / "logs" / "worker-0.log"
            run(client, db, worker, log, {**source, "seed": 0})  # warm-up: not counted
            source_id = run(client, db, worker, log, {**source, "seed": 1})
            promoted = client.post(f"/v1/jobs/{source_id}/model", json={"name": PROMOTED})
            if promoted.status_code not in (200, 201):
                raise SystemExit(f"promote refused ({promoted.status_code}): {promoted.text}")
            specs = {
                "eval": {
                    "model_name_or_path": f"job:{source_id}",
                    "task_name": "sst2",
                    "do_train": False,
                    "do_eval": True,
                    "max_eval_samples": args.eval_rows,
                    "per_device_eval_batch_size": 32,
                },
                "train": source,
                "job": {**QUICK_JOB, "model_name_or_path": f"job:{source_id}", "logging_steps": 1},
                "model": {**QUICK_JOB, "model_name_or_path": f"model:{PROMOTED}", "logging_steps": 1},
            }
            ids: dict[str, list[int]] = {kind: [] for kind in KINDS}
            started = time.monotonic()
            for round_ in range(args.rounds):
                for kind in KINDS:
                    ids[kind].append(run(client, db, worker, log, {**specs[kind], "seed": 100 + round_}))
            wall_s = time.monotonic() - started
        report = {
            "rounds": args.rounds,
            "eval_rows": args.eval_rows,
            "warm_start": args.warm_start,
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": load_average(),
            "wall_s": round(wall_s, 1),
            "source_job": source_id,
            "eval_job_claim_to_eval_row_s": summary([to_row(db, i, "eval") for i in ids["eval"]]),
            "eval_job_evaluation_s": summary([evaluation_itself(db, i) for i in ids["eval"]]),
            "eval_job_forward_passes_s": summary([measured_eval(db, i) for i in ids["eval"]]),
            "train_job_forward_passes_s": summary([measured_eval(db, i) for i in ids["train"]]),
            "train_job_claim_to_final_eval_row_s": summary([to_row(db, i, "eval") for i in ids["train"]]),
            "train_job_last_step_to_eval_row_s": summary([last_step_to_eval(db, i) for i in ids["train"]]),
            "job_source_claim_to_first_step_s": summary([to_row(db, i, "train") for i in ids["job"]]),
            "model_source_claim_to_first_step_s": summary([to_row(db, i, "train") for i in ids["model"]]),
        }
        db.dispose()
    print(json.dumps(report, indent=2))
    return 0


def run(
    client: httpx.Client, db: Database, worker: subprocess.Popen[bytes], log: Path, spec: dict[str, Any]
) -> int:
    """Submit the job through the API and wait until it succeeds (one at a time: the claims do not queue)."""
    response = client.post("/v1/jobs", json={"spec": spec, "max_attempts": 1})
    if response.status_code != 201:
        raise SystemExit(f"the API refused the job ({response.status_code}): {response.text}")
    job_id = int(response.json()["id"])
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited: see {log}")
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        if job["status"] == "succeeded":
            return job_id
        if job["status"] in ("failed", "cancelled"):
            raise SystemExit(f"job {job_id} {job['status']}: {job.get('error')}")
        time.sleep(0.2)
    raise SystemExit(f"job {job_id} did not finish in time: see {log}")


def _claimed(db: Database, job_id: int) -> datetime:
    with db.session() as session, read(session):
        events = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
        return next(e.created_at for e in events if e.message.startswith("claimed by worker"))


def _first_row(db: Database, job_id: int, split: str, *, last: bool = False) -> datetime:
    order = JobMetric.id.desc() if last else JobMetric.id
    with db.session() as session, read(session):
        found = session.scalars(
            select(JobMetric.created_at)
            .where(JobMetric.job_id == job_id, JobMetric.split == split)
            .order_by(order)
        ).first()
    assert found is not None, f"job {job_id} wrote no {split} row"
    return found


def to_row(db: Database, job_id: int, split: str) -> float:
    """Seconds from the job's claim to its first row of `split` (eval: its evaluation; train: step 1)."""
    return (_first_row(db, job_id, split) - _claimed(db, job_id)).total_seconds()


def evaluation_itself(db: Database, job_id: int) -> float:
    """An evaluation job's evaluation: its 'no training' event (model loaded, batches ready) -> its row."""
    with db.session() as session, read(session):
        events = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
        ready = next(e.created_at for e in events if e.message.startswith("no training"))
    return (_first_row(db, job_id, "eval") - ready).total_seconds()


def measured_eval(db: Database, job_id: int) -> float:
    """The evaluation's batches and metrics as the job timed them (its evaluation event's
    eval_runtime_s), without the rows' writes."""
    with db.session() as session, read(session):
        events = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
        timed = next(e.data for e in events if e.data and "eval_runtime_s" in e.data)
    return float(sum(timed["eval_runtime_s"].values()))


def last_step_to_eval(db: Database, job_id: int) -> float:
    """A training job's evaluation at its end: its last training row -> its evaluation row."""
    return (_first_row(db, job_id, "eval") - _first_row(db, job_id, "train", last=True)).total_seconds()


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "p90": percentile(values, 0.9),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
        "unknown",
    )


if __name__ == "__main__":
    sys.exit(main())
