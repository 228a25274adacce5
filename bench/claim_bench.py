"""What does fair share cost the claim? p50/p99 claim latency and claims per second on Postgres.

For each mode (fair share on, then off) a fresh scratch database gets 10,000 queued jobs from 20
owners (inserted in bulk: the figures are the claim's, not the API's); then 8 worker processes each
loop claim_next → finish_job, as a worker with one free device does, until `--claims` jobs have run.
The claim is timed alone (claim_p50_ms, claim_p99_ms); claims_per_s is claims over the wall time of
the whole drain (claim and finish). With fair share on, the claim's policy is the workers' own
(ClaimPolicy.from_settings: fair share, quotas, reservations), so its extra reads are counted too.
Prints one JSON line per mode and the machine's load average.

Where a claim's time goes (issue 23): each worker times the claim's SQL statements from the client
(SQLAlchemy's cursor-execute events: the statement's round trip, which includes the server's work
and any wait for a CPU on either side), so a claim splits into `sql_ms` (its statements) and the
rest (Python, the commit, the worker's own wait for a core); `statements` counts its round trips.
Then the first claim's statements are run again under EXPLAIN ANALYZE on the drained database (one
connection, nothing else running, rolled back): `server_ms` is what Postgres itself spends executing
and planning them. `worker_cpu_p50_ms` is the worker process's own CPU per claim (process_time) and
`claim_cpu_share_p50` the median share of a claim's wall time that was its own CPU: what remains is
waiting (for Postgres's answer, for a lock, or for a core). With `--workers 1` the same figures show
a claim without competition.

Issue 37 (the claim in one statement): `--paths old,new` runs, in one invocation and on fresh
databases each, the stepwise claim (`queue._claim_stepwise`, the claim before issue 37) and today's
`claim_next` (one statement on Postgres: shared/jobs_repo/claim_statement.py), so their figures come
from the same machine at the same load. `round_trips_per_claim` counts the messages a claim sends
that each wait for an answer (libpq's protocol trace: each Sync and each simple Query, the pool's
pre-ping and BEGIN/COMMIT included), over `--traced` claims made by one more process after the
timed run. Each line names the CPU model (lscpu) and the load average: the 2-core machine is shared.

    python bench/claim_bench.py
    python bench/claim_bench.py --modes on --paths old,new
    python bench/claim_bench.py --jobs 10000 --owners 20 --workers 8 --claims 2000 \
        --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, insert, text

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import load_average, percentile, scratch_postgres  # noqa: E402
from shared import jobs_repo  # noqa: E402
from shared.core.config import Settings  # noqa: E402
from shared.core.db import Database  # noqa: E402
from shared.core.migrate import upgrade  # noqa: E402
from shared.core.tables import Job, JobStatus, Owner, utcnow  # noqa: E402
from shared.jobs_repo.queue import _claim_stepwise  # noqa: E402
from shared.scheduling.fair_share import ClaimPolicy  # noqa: E402

SPEC = {"model_name_or_path": "tiny-bert", "task_name": "sst2", "seed": 1, "noop": True}


def fill(db: Database, *, jobs: int, owners: int, max_devices: int | None = None) -> None:
    """`jobs` queued jobs, owner i's jobs interleaved with the others', priorities 0–2; with
    `max_devices`, every owner's own device quota."""
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
        connection.execute(
            insert(Owner),
            [{"name": f"owner-{i:02d}", "share": 1.0, "max_devices": max_devices} for i in range(owners)],
        )
        connection.execute(insert(Job.__table__), rows)
        connection.execute(text("ANALYZE jobs"))


def record_statements(engine: Engine, into: list[tuple[str, Any, float]]) -> None:
    """Append (statement, parameters, seconds) for every statement `engine` runs."""

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        conn.info["bench_started"] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        into.append((statement, parameters, time.perf_counter() - conn.info.pop("bench_started")))


# The claims compared: before issue 37 (several statements) and today's (one statement on Postgres).
PATHS = {"old": _claim_stepwise, "new": jobs_repo.claim_next}


def work(url: str, worker: str, claims: int, policy: ClaimPolicy, out: Any, path: str = "new") -> None:
    """Claim and finish `claims` jobs; per claim (ms, its statements' ms, their count), and the
    statements of the first claim."""
    claim_next = PATHS[path]
    db = Database(url)
    statements: list[tuple[str, Any, float]] = []
    record_statements(db.engine, statements)
    timings = []
    first: list[tuple[str, Any]] = []
    with db.session() as session:
        for _ in range(claims):
            statements.clear()
            started, cpu_started = time.perf_counter(), time.process_time()
            job = claim_next(
                session, worker_id=worker, lease_s=60, max_processes=1, capacity=1, policy=policy
            )
            timings.append(
                (
                    (time.perf_counter() - started) * 1000,
                    sum(s for *_, s in statements) * 1000,
                    len(statements),
                    (time.process_time() - cpu_started) * 1000,
                )
            )
            if not first:
                first = [(statement, parameters) for statement, parameters, _ in statements]
            if job is None:
                break
            claim = jobs_repo.Claim(job.id, worker, job.attempts)
            jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
    db.dispose()
    out.put((timings, first))


def server_ms(url: str, statements: list[tuple[str, Any]]) -> tuple[float, list[tuple[float, str]]]:
    """Postgres's own execution and planning time for `statements` (EXPLAIN ANALYZE, rolled back),
    on a warm connection."""
    db = Database(url)
    each: list[tuple[float, str]] = []
    try:
        with db.engine.connect() as connection:
            # Twice, each rolled back: the second pass is a warm backend's (the first pays for
            # reading the catalog into a new connection's caches, as a worker does once).
            for _ in range(2):
                each = []
                transaction = connection.begin()
                for statement, parameters in statements:
                    plan = connection.exec_driver_sql(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
                    ).scalar_one()
                    top = plan[0] if isinstance(plan, list) else json.loads(plan)[0]
                    took = top.get("Execution Time", 0.0) + top.get("Planning Time", 0.0)
                    each.append((round(took, 3), " ".join(statement.split())[:70]))
                transaction.rollback()
    finally:
        db.dispose()
    return round(sum(ms for ms, _ in each), 2), each


def round_trips(url: str, claims: int, policy: ClaimPolicy, path: str) -> float:
    """Round trips per claim over `claims` claims (each then finished, outside the count): the
    frontend messages that wait for the server's answer in libpq's protocol trace (Sync ends an
    extended-protocol statement, Query is a simple one: the pool's pre-ping, BEGIN, COMMIT)."""
    from psycopg import pq

    claim_next = PATHS[path]
    db = Database(url)
    with tempfile.TemporaryFile("a+") as trace:  # O_APPEND: libpq writes at the end

        @event.listens_for(db.engine, "connect")
        def _trace(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.pgconn.trace(trace.fileno())
            dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

        counted = []
        with db.session() as session:
            for _ in range(claims):
                start = os.lseek(trace.fileno(), 0, os.SEEK_END)
                job = claim_next(
                    session, worker_id="traced", lease_s=60, max_processes=1, capacity=1, policy=policy
                )
                end = os.lseek(trace.fileno(), 0, os.SEEK_END)
                os.lseek(trace.fileno(), start, os.SEEK_SET)
                lines = os.read(trace.fileno(), end - start).decode(errors="replace").splitlines()
                counted.append(
                    sum(
                        1
                        for line in lines
                        if line.startswith("F\t") and line.split("\t")[2:3] in (["Sync"], ["Query"])
                    )
                )
                if job is None:
                    break
                jobs_repo.finish_job(
                    session, claim=jobs_repo.Claim(job.id, "traced", job.attempts), status=JobStatus.succeeded
                )
        db.dispose()  # before the trace's file closes
    # The first claim opens the connection (no pre-ping): count the claims of a warm pool.
    warm = counted[1:] or counted
    return round(sum(warm) / len(warm), 2)


def cpu_model() -> str:
    """lscpu's model name and CPU count (the figures are this machine's)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return "unknown"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs"


def run_mode(args: argparse.Namespace, *, fair_share: bool, path: str = "new") -> dict[str, Any]:
    name = f"gluejobs_claim_bench_{os.getpid()}_{int(fair_share)}_{path}"
    with scratch_postgres(args.postgres, name) as url:
        db = Database(url)
        try:
            upgrade(db)
            fill(db, jobs=args.jobs, owners=args.owners, max_devices=args.owner_max_devices)
            settings = Settings(database_url=url, fair_share=fair_share)  # type: ignore[call-arg]
            policy = ClaimPolicy.from_settings(settings)
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            each = args.claims // args.workers
            started = time.perf_counter()
            processes = [
                ctx.Process(target=work, args=(url, f"bench-{i}", each, policy, out, path))
                for i in range(args.workers)
            ]
            for process in processes:
                process.start()
            results = [out.get(timeout=1800) for _ in processes]
            elapsed = time.perf_counter() - started
            for process in processes:
                process.join(60)
            timings = [t for worker_timings, _ in results for t in worker_timings]
            explained = server_ms(url, results[0][1])
            trips = round_trips(url, args.traced, policy, path)
        finally:
            db.dispose()
    latencies = [total for total, *_ in timings]
    sql = [statements_ms for _, statements_ms, *_ in timings]
    cpu = [cpu_ms for *_, cpu_ms in timings]
    return {
        "path": path,
        "fair_share": fair_share,
        "queued_jobs": args.jobs,
        "owners": args.owners,
        "owner_max_devices": args.owner_max_devices,
        "workers": args.workers,
        "claims": len(latencies),
        "claim_p50_ms": percentile(latencies, 0.5),
        "claim_p99_ms": percentile(latencies, 0.99),
        "claims_per_s": round(len(latencies) / elapsed, 1),
        "round_trips_per_claim": trips,
        "statements_per_claim": round(sum(n for _, _, n, _ in timings) / len(timings), 2),
        "sql_p50_ms": percentile(sql, 0.5),
        "sql_p99_ms": percentile(sql, 0.99),
        "outside_sql_p50_ms": percentile([t - s for t, s, *_ in timings], 0.5),
        # The worker's own CPU per claim: the rest of a claim's time is waiting, for Postgres (its
        # own CPU is server_ms) or for a core (8 workers and Postgres share two).
        "worker_cpu_p50_ms": percentile(cpu, 0.5),
        "worker_cpu_p99_ms": percentile(cpu, 0.99),
        "claim_cpu_share_p50": round(statistics.median(c / t for t, _, _, c in timings if t > 0), 3),
        "server_ms": explained[0],
        "server_ms_each": explained[1],
        "load_average": load_average(),
        "cpu": cpu_model(),
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
    parser.add_argument("--modes", default="on,off", help="fair share on, off, or both")
    parser.add_argument(
        "--paths", default="old,new", help="the claim before issue 37 (old), today's (new), or both"
    )
    parser.add_argument(
        "--owner-max-devices",
        type=int,
        default=None,
        help="give every owner its own max_devices (the claim of a device-limited owner's job)",
    )
    parser.add_argument("--traced", type=int, default=21, help="claims whose round trips are counted")
    args = parser.parse_args()
    for fair_share in (mode.strip() == "on" for mode in args.modes.split(",")):
        for path in (p.strip() for p in args.paths.split(",")):
            print(json.dumps(run_mode(args, fair_share=fair_share, path=path)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
