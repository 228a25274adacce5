"""How fast does a fleet drain a queue, and does any job get claimed twice? Prints one JSON line.

Queues N no-op jobs (spec `noop: true`: the job's process starts, reports and succeeds at once, so
the figures are the queue's and the process start's, not training's) in a fresh Postgres database,
starts the API as its own process and W worker processes (`python -m worker --exit-when-idle`),
and while they drain the queue polls GET /v1/jobs/{id} with a few clients. Prints:

- claims_per_s: jobs claimed per second over the drain (first claim to last);
- claim_p50_ms / claim_p99_ms: how long one claim statement took in a worker (its log line);
- double_claims: jobs claimed more than once, or run more than one attempt (must be 0);
- api_get_job_p50_ms / api_get_job_p99_ms during the drain;
- the machine's load average beside them (the figures follow the load on a shared machine).

    python bench/fleet_bench.py
    python bench/fleet_bench.py --jobs 1000 --workers 8 --postgres postgresql+psycopg://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import QUIET_API, bench_settings, percentile, run_folder, scratch_postgres  # noqa: E402
from gluejobs_server.stack import local_stack  # noqa: E402
from shared import jobs_repo  # noqa: E402
from shared.core.db import Database, read  # noqa: E402
from shared.core.migrate import upgrade  # noqa: E402
from shared.core.tables import Job, JobEvent, JobStatus  # noqa: E402

SPEC = {"model_name_or_path": "tiny-bert", "task_name": "sst2", "seed": 1, "noop": True}
API_CLIENTS = 4
CLAIM_LINE = re.compile(r"claimed job (\d+) \(attempt (\d+)\) in ([0-9.]+) ms")


def queue(db: Database, jobs: int) -> list[int]:
    ids = []
    with db.session() as session:
        for _ in range(jobs):
            ids.append(jobs_repo.create_job(session, spec=SPEC).id)
    return ids


async def poll_jobs(base: str, ids: list[int], done: asyncio.Event) -> list[float]:
    latencies: list[float] = []

    async def poll(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            started = time.perf_counter()
            response = await client.get(f"/v1/jobs/{random.choice(ids)}")
            response.raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)

    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        await asyncio.gather(*(poll(client) for _ in range(API_CLIENTS)))
    return latencies


async def drain(base: str, ids: list[int], workers: list[subprocess.Popen[bytes]]) -> list[float]:
    done = asyncio.Event()
    poller = asyncio.create_task(poll_jobs(base, ids, done))
    while any(p.poll() is None for p in workers):
        await asyncio.sleep(0.2)
    done.set()
    return await poller


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "GLUEJOBS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
        help="a Postgres server (its database is used to create and drop a fresh one)",
    )
    args = parser.parse_args()

    name = f"gluejobs_fleet_bench_{os.getpid()}"
    with scratch_postgres(args.postgres, name) as database_url:
        _run(args, database_url)
    return 0


def _run(args: argparse.Namespace, database_url: str) -> None:
    db = Database(database_url)
    try:
        with run_folder("gluejobs-fleet-") as root:
            settings = bench_settings(
                root,
                database_url=database_url,
                data_dir=root,
                models_dir=root,
                device_lock_dir=root / "locks",
                poll_interval_s=0.2,
                heartbeat_s=1.0,
            )
            upgrade(db)
            ids = queue(db, args.jobs)
            with local_stack(
                settings, logs=root / "api", workers=0, migrate=False, api_command=QUIET_API
            ) as api:
                load_before = os.getloadavg()
                started = time.perf_counter()
                with local_stack(
                    settings,
                    logs=root / "workers",
                    api=False,
                    workers=args.workers,
                    worker_args=("--exit-when-idle", "--devices", "cpu"),
                    migrate=False,
                ) as fleet:
                    latencies = asyncio.run(drain(api.url, ids, fleet.workers))
                elapsed = time.perf_counter() - started
                load_after = os.getloadavg()
            exit_codes = [p.returncode for p in fleet.workers]
            logs = [fleet.logs / f"worker-{index}.log" for index in range(args.workers)]
            figures = _figures(db, args, logs, elapsed, latencies, exit_codes, load_before, load_after)
        print(json.dumps(figures))
    finally:
        db.dispose()


def _figures(
    db: Database,
    args: argparse.Namespace,
    logs: list[Path],
    elapsed: float,
    latencies: list[float],
    exit_codes: list[int],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    claims_ms = [float(m.group(3)) for log in logs for m in CLAIM_LINE.finditer(log.read_text())]
    with db.session() as session, read(session):
        statuses = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        first, last = session.execute(select(func.min(Job.started_at), func.max(Job.started_at))).one()
        claims_per_job = session.execute(
            select(JobEvent.job_id, func.count())
            .where(JobEvent.message.like("claimed by worker%"))
            .group_by(JobEvent.job_id)
        ).all()
        retried = session.scalar(select(func.count()).select_from(Job).where(Job.attempts > 1))
        twice = [job_id for job_id, count in claims_per_job if count > 1][:3]
        evidence = {
            job_id: session.scalars(
                select(JobEvent.message).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            ).all()
            for job_id in twice
        }
    double = sum(1 for _, count in claims_per_job if count > 1) + (retried or 0)
    span_s = (last - first).total_seconds() if first and last else 0.0
    figures: dict[str, Any] = {
        "benchmark": "fleet-drain",
        "database": "postgresql",
        "jobs": args.jobs,
        "workers": args.workers,
        "succeeded": statuses.get(JobStatus.succeeded, 0),
        "other_statuses": {str(k): v for k, v in statuses.items() if k != JobStatus.succeeded},
        "drain_s": round(elapsed, 1),
        "claims_per_s": round(len(claims_per_job) / span_s, 1) if span_s else None,
        "claim_p50_ms": percentile(claims_ms, 0.50) if claims_ms else None,
        "claim_p99_ms": percentile(claims_ms, 0.99) if claims_ms else None,
        "double_claims": double,
        "double_claim_events": {str(k): [m[:160] for m in v] for k, v in evidence.items()},
        "api_get_job_requests": len(latencies),
        "api_get_job_p50_ms": percentile(latencies, 0.50) if latencies else None,
        "api_get_job_p99_ms": percentile(latencies, 0.99) if latencies else None,
        "worker_exit_codes": sorted(set(exit_codes)),
        "load_average_before": [round(x, 1) for x in load_before],
        "load_average_after": [round(x, 1) for x in load_after],
        "cpus": os.cpu_count(),
    }
    return figures


if __name__ == "__main__":
    sys.exit(main())
