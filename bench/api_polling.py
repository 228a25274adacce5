"""Does reading a job stay fast while its metric rows pile up, for one client and for a crowd?
Prints one JSON line.

One job with 10 metric rows and one with 100,000. The API runs as its own uvicorn process (so its
CPU can be measured apart from the clients):

1. one client, median latency of what a dashboard reads: the job, the newest metric rows (`after=` a
   cursor near the end), the events — on the small and the large job;
2. 50 concurrent pollers on the cursor endpoint of the large job: requests/s, p50/p99 latency;
3. 50 open streams (GET /stream, resumed at the end with Last-Event-ID) on the large job while a
   writer adds a metric row every 100 ms: delivery lag p50/p99 (commit → received) and the API's
   CPU per open stream.

    python bench/api_polling.py
    python bench/api_polling.py --database-url postgresql+psycopg://postgres@127.0.0.1/bench
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import QUIET_API, bench_settings, percentile, run_folder  # noqa: E402
from gluejobs.stack import local_stack  # noqa: E402
from shared import jobs_repo  # noqa: E402
from shared.db import Database  # noqa: E402
from shared.jobs_repo import Claim, MetricRow  # noqa: E402
from shared.migrate import upgrade  # noqa: E402
from shared.models import JobStatus  # noqa: E402

SPEC = {"model_name_or_path": "bert-base-uncased", "task_name": "sst2", "seed": 1}
CLIENTS = 50
CROWD_SECONDS = 10.0
WRITE_INTERVAL_S = 0.1
# The benchmark's jobs are claimed by no real worker: a lease that outlasts the run.
LEASE_S = 24 * 3600.0


def fill(db: Database, rows: int) -> Claim:
    """A running job with `rows` metric rows; its claim (every write of a job's rows carries one)."""
    with db.session() as session:
        jobs_repo.create_job(session, spec=SPEC)
        job = jobs_repo.claim_next(session, worker_id="bench", lease_s=LEASE_S)
        assert job is not None
        claim = Claim(job.id, "bench", job.attempts)
        for start in range(0, rows, 5000):
            batch = [
                MetricRow(epoch=s / 1000, step=s, split="train", name="loss", value=1.0 / (s + 1))
                for s in range(start, min(rows, start + 5000))
            ]
            jobs_repo.add_metrics(session, job_id=job.id, rows=batch, claim=claim)
    return claim


def median_ms(client: httpx.Client, path: str, params: dict[str, str | int], repeat: int) -> float:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(path, params=params).raise_for_status()
        timings.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(timings), 2)


# --- 50 pollers -------------------------------------------------------------------------------------


async def pollers(base: str, job_id: int, cursor: int, server: psutil.Process) -> dict[str, float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + CROWD_SECONDS

    async def poll(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            response = await client.get(f"/v1/jobs/{job_id}/metrics", params={"after": cursor, "limit": 1000})
            response.raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)

    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        cpu_before = sum(server.cpu_times()[:2])
        started = time.perf_counter()
        await asyncio.gather(*(poll(client) for _ in range(CLIENTS)))
        elapsed = time.perf_counter() - started
        cpu = sum(server.cpu_times()[:2]) - cpu_before
    return {
        "pollers": CLIENTS,
        "poll_requests_per_s": round(len(latencies) / elapsed, 1),
        # On a shared machine throughput follows the load; the API's CPU per request does not.
        "api_cpu_ms_per_poll": round(1000 * cpu / len(latencies), 2),
        "poll_p50_ms": percentile(latencies, 0.50),
        "poll_p99_ms": percentile(latencies, 0.99),
    }


# --- 50 streams -------------------------------------------------------------------------------------


async def streams(
    base: str, db: Database, claim: Claim, resume_from: str, server: psutil.Process
) -> dict[str, Any]:
    job_id = claim.job_id
    committed: dict[int, float] = {}  # step → when its row was committed
    lags: list[float] = []
    ready = asyncio.Event()
    opened = 0

    async def listen(client: httpx.AsyncClient) -> None:
        nonlocal opened
        headers = {"Last-Event-ID": resume_from}
        async with client.stream("GET", f"/v1/jobs/{job_id}/stream", headers=headers) as response:
            response.raise_for_status()
            opened += 1
            if opened == CLIENTS:
                ready.set()
            event = None
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "metric":
                    step = json.loads(line[6:])["step"]
                    if step in committed:
                        lags.append((time.time() - committed[step]) * 1000)
                elif line.startswith("data: ") and event == "end":
                    return

    def write(stop: threading.Event) -> None:
        step = 10_000_000
        while not stop.is_set():
            with db.session() as session:
                jobs_repo.add_metrics(
                    session,
                    job_id=job_id,
                    rows=[MetricRow(epoch=1.0, step=step, split="train", name="loss", value=0.5)],
                    claim=claim,
                )
            committed[step] = time.time()
            step += 1
            stop.wait(WRITE_INTERVAL_S)

    limits = httpx.Limits(max_connections=CLIENTS + 5, max_keepalive_connections=CLIENTS + 5)
    async with httpx.AsyncClient(
        base_url=base, timeout=httpx.Timeout(60, read=None), limits=limits
    ) as client:
        listeners = [asyncio.create_task(listen(client)) for _ in range(CLIENTS)]
        await asyncio.wait_for(ready.wait(), 60)
        await asyncio.sleep(1.0)  # settled: every stream has made its first read
        stop = threading.Event()
        writer = threading.Thread(target=write, args=(stop,), daemon=True)
        cpu_before = sum(server.cpu_times()[:2])
        started = time.perf_counter()
        writer.start()
        await asyncio.sleep(CROWD_SECONDS)
        stop.set()
        writer.join()
        await asyncio.sleep(2.0)  # the last rows' delivery
        elapsed = time.perf_counter() - started
        cpu = sum(server.cpu_times()[:2]) - cpu_before
        # End the job: every stream then closes by itself.
        with db.session() as session:
            jobs_repo.finish_job(session, claim=claim, status=JobStatus.cancelled)
        await asyncio.wait_for(asyncio.gather(*listeners), 30)
    return {
        "streams": CLIENTS,
        "rows_written": len(committed),
        "rows_delivered": len(lags),
        "stream_lag_p50_ms": percentile(lags, 0.50),
        "stream_lag_p99_ms": percentile(lags, 0.99),
        "api_cpu_percent_per_stream": round(100 * cpu / elapsed / CLIENTS, 3),
        "api_cpu_percent_50_streams": round(100 * cpu / elapsed, 1),
    }


# --- the API as a process of its own ----------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()

    with run_folder("gluejobs-poll-") as root:
        settings = bench_settings(root, database_url=args.database_url)
        db = Database(settings.database_url)
        upgrade(db)
        try:
            small_claim, large_claim = fill(db, 10), fill(db, args.rows)
            with local_stack(
                settings, logs=root / "logs", workers=0, migrate=False, api_command=QUIET_API
            ) as stack:
                assert stack.api is not None
                figures = measure(
                    stack.url, db, psutil.Process(stack.api.pid), small_claim, large_claim, args
                )
        finally:
            db.dispose()
    print(json.dumps(figures))
    return 0


def measure(
    base: str, db: Database, server: psutil.Process, small: Claim, large: Claim, args: argparse.Namespace
) -> dict[str, object]:
    figures: dict[str, object] = {"benchmark": "api-polling", "database": db.dialect, "rows": args.rows}
    with httpx.Client(base_url=base, timeout=30) as client:
        for label, job_id, rows in (
            ("10_rows", small.job_id, 10),
            (f"{args.rows}_rows", large.job_id, args.rows),
        ):
            first_id = client.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 1}).json()["data"][0]["id"]
            cursor = first_id + rows - 10  # a poller that has seen all but the newest ten rows
            figures[f"job_ms_{label}"] = median_ms(client, f"/v1/jobs/{job_id}", {}, args.repeat)
            figures[f"metrics_after_ms_{label}"] = median_ms(
                client, f"/v1/jobs/{job_id}/metrics", {"after": cursor, "limit": 1000}, args.repeat
            )
            figures[f"events_ms_{label}"] = median_ms(client, f"/v1/jobs/{job_id}/events", {}, args.repeat)
        last_metric = first_id + args.rows - 1
        last_event = client.get(f"/v1/jobs/{large.job_id}/events").json()["data"][-1]["id"]
    figures["machine_load_1min"] = round(os.getloadavg()[0], 1)
    figures.update(asyncio.run(pollers(base, large.job_id, last_metric - 10, server)))
    figures.update(asyncio.run(streams(base, db, large, f"{last_metric}.{last_event}", server)))
    return figures


if __name__ == "__main__":
    sys.exit(main())
