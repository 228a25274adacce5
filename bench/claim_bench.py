"""What does fair share cost the claim? p50/p99 claim latency and claims per second on Postgres.

For each mode (fair share on, then off) a fresh scratch database gets 10,000 queued jobs from 20
owners (inserted in bulk: the figures are the claim's, not the API's); then 8 worker processes each
loop claim_next → finish_job, as a worker with one free device does, until `--claims` jobs have run.
The claim is timed alone (claim_p50_ms, claim_p99_ms); claims_per_s is claims over the wall time of
the whole drain (claim and finish). With fair share on, the claim's policy is the workers' own
(ClaimPolicy.from_settings: fair share, quotas, reservations), so its extra reads are counted too.
Prints one JSON line per mode and the machine's load average.

    python bench/claim_bench.py
    python bench/claim_bench.py --jobs 10000 --owners 20 --workers 8 --claims 2000 \
        --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert, text

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import load_average, percentile, scratch_postgres  # noqa: E402
from shared import jobs_repo  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.db import Database  # noqa: E402
from shared.fair_share import ClaimPolicy  # noqa: E402
from shared.migrate import upgrade  # noqa: E402
from shared.models import Job, JobStatus, Owner, utcnow  # noqa: E402

SPEC = {"model_name_or_path": "tiny-bert", "task_name": "sst2", "seed": 1, "noop": True}


def fill(db: Database, *, jobs: int, owners: int) -> None:
    """`jobs` queued jobs, owner i's jobs interleaved with the others', priorities 0–2."""
    now = utcnow()
    rows = [
        {
            "spec": SPEC,
            "priority": index % 3,
            "metadata": {},
            "owner": f"owner-{index % owners:02d}",
            "status": JobStatus.queued,
            "num_processes": 1,
            "latest_metrics": {},
            "created_at": now,
            "updated_at": now,
        }
        for index in range(jobs)
    ]
    with db.engine.begin() as connection:
        connection.execute(insert(Owner), [{"name": f"owner-{i:02d}", "share": 1.0} for i in range(owners)])
        connection.execute(insert(Job.__table__), rows)
        connection.execute(text("ANALYZE jobs"))


def work(url: str, worker: str, claims: int, policy: ClaimPolicy, out: Any) -> None:
    """Claim and finish `claims` jobs; the claims' durations in ms."""
    db = Database(url)
    latencies = []
    with db.session() as session:
        for _ in range(claims):
            started = time.perf_counter()
            job = jobs_repo.claim_next(
                session, worker_id=worker, lease_s=60, max_processes=1, capacity=1, policy=policy
            )
            latencies.append((time.perf_counter() - started) * 1000)
            if job is None:
                break
            claim = jobs_repo.Claim(job.id, worker, job.attempts)
            jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
    db.dispose()
    out.put(latencies)


def run_mode(args: argparse.Namespace, *, fair_share: bool) -> dict[str, Any]:
    name = f"gluejobs_claim_bench_{os.getpid()}_{int(fair_share)}"
    with scratch_postgres(args.postgres, name) as url:
        db = Database(url)
        try:
            upgrade(db)
            fill(db, jobs=args.jobs, owners=args.owners)
            settings = Settings(database_url=url, fair_share=fair_share)  # type: ignore[call-arg]
            policy = ClaimPolicy.from_settings(settings)
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            each = args.claims // args.workers
            started = time.perf_counter()
            processes = [
                ctx.Process(target=work, args=(url, f"bench-{i}", each, policy, out))
                for i in range(args.workers)
            ]
            for process in processes:
                process.start()
            latencies = [ms for _ in processes for ms in out.get(timeout=1800)]
            elapsed = time.perf_counter() - started
            for process in processes:
                process.join(60)
        finally:
            db.dispose()
    return {
        "fair_share": fair_share,
        "queued_jobs": args.jobs,
        "owners": args.owners,
        "workers": args.workers,
        "claims": len(latencies),
        "claim_p50_ms": percentile(latencies, 0.5),
        "claim_p99_ms": percentile(latencies, 0.99),
        "claims_per_s": round(len(latencies) / elapsed, 1),
        "load_average": load_average(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--owners", type=int, default=20)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--claims", type=int, default=2000, help="claims in all (the queue stays above 8,000)"
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "GLUEJOBS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
        help="a Postgres server (its database is used to create and drop a fresh one per mode)",
    )
    args = parser.parse_args()
    for fair_share in (True, False):
        print(json.dumps(run_mode(args, fair_share=fair_share)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
