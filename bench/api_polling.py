"""Does reading a job stay fast while its metric rows pile up, for one client and for a crowd?
Prints one JSON line.

One job with 10 metric rows and one with 100,000. The API runs as its own uvicorn process (so its
CPU can be measured apart from the clients), and every client sends a stored API key (its lookup
and rate counting are part of each request's cost; the read limit is raised so that the crowd is
not refused):

1. one client, median latency of what a dashboard reads: the job, the newest metric rows (`after=` a
   cursor near the end), the events — on the small and the large job;
2. 50 concurrent pollers on the cursor endpoint of the large job: requests/s, p50/p99 latency, the
   API's CPU per poll, and the same net of the CPU its background threads spend when nobody polls
   (measured for IDLE_SECONDS just before: on a loaded machine the pollers make few requests, and
   that CPU spread over them reads as a cost per poll);
3. 50 open streams (GET /stream, resumed at the end with Last-Event-ID; `--streams N` for another
   count, 1 for none of the fan-out) on the large job while a writer adds a metric row every 100 ms
   for `--stream-seconds` (60: 600 rows): delivery lag p50/p99 (commit → received, every stream's
   copy), the same for the first of the 50 to receive each row, the five slowest of those with when
   their row was written (a tail that clusters in time points at its cause), and the API's CPU per
   open stream.

Progress goes to stderr phase by phase; `--parts` runs some of the three (e.g. `polls,streams`);
`--profile PATH` runs the API under cProfile in all its threads (bench/profiled_api.py) for the
pollers alone and prints its top functions. A run takes about 5 minutes on a loaded 2-core machine.

Beside the pollers, in the same run, the bare-framework floor (../shared/tools/bare_api_floor.py: a
bare FastAPI + SQLAlchemy app answering the same cursor query from a 100k-row SQLite table) is
measured just before and just after them; the line prints its CPU per poll and the API's ratio to
it. `--before PATH` runs the same measurements first against the API of another checkout (main's,
for before/after figures from one run on one machine), printing a line for each.

    python bench/api_polling.py
    python bench/api_polling.py --postgres postgresql+psycopg://postgres@127.0.0.1/postgres
    git worktree add /tmp/before main && python bench/api_polling.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy import insert

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import (  # noqa: E402
    QUIET_API,
    bench_settings,
    load_average,
    percentile,
    run_folder,
    scratch_postgres,
)
from gluejobs_server.stack import local_stack  # noqa: E402
from service.accounts import api_keys  # noqa: E402
from shared import jobs_repo  # noqa: E402
from shared.core.db import Database  # noqa: E402
from shared.core.migrate import upgrade  # noqa: E402
from shared.core.tables import JobMetric, JobStatus, KeyRole, utcnow  # noqa: E402
from shared.jobs_repo import Claim, MetricRow  # noqa: E402

SPEC = {"model_name_or_path": "bert-base-uncased", "task_name": "sst2", "seed": 1}
CLIENTS = 50
CROWD_SECONDS = 10.0
STREAM_SECONDS = 60.0  # 600 rows: a p99 that is not one row's
IDLE_SECONDS = 3.0
WRITE_INTERVAL_S = 0.1
# The benchmark's jobs are claimed by no real worker: a lease that outlasts the run.
LEASE_S = 24 * 3600.0
# Reads one key may make a minute: far above what the crowd makes, so that nothing is refused.
READS_PER_MINUTE = 1_000_000
FLOOR = REPO.parent / "shared" / "tools" / "bare_api_floor.py"
# The floor's requests (after as many to warm it up): a loaded machine's pollers make a few hundred
# in CROWD_SECONDS, so more would only lengthen the run.
FLOOR_REQUESTS = 800


def fill(db: Database, rows: int) -> Claim:
    """A running job with `rows` metric rows; its claim (every write of a job's rows carries one).
    The first rows go through add_metrics as a worker's do; the rest in bulk (one executemany: on
    Postgres add_metrics' 5,000-row statements took minutes of a loaded machine)."""
    with db.session() as session:
        jobs_repo.create_job(session, spec=SPEC)
        job = jobs_repo.claim_next(session, worker_id="bench", lease_s=LEASE_S)
        assert job is not None
        claim = Claim(job.id, "bench", job.attempts)
        head = min(rows, 10)
        first = [
            MetricRow(epoch=s / 1000, step=s, split="train", name="loss", value=1.0 / (s + 1))
            for s in range(head)
        ]
        jobs_repo.add_metrics(session, job_id=job.id, rows=first, claim=claim)
    if rows > head:
        now = utcnow()
        with db.engine.begin() as connection:
            connection.execute(
                insert(JobMetric),
                [
                    {
                        "job_id": job.id,
                        "epoch": s / 1000,
                        "step": s,
                        "split": "train",
                        "name": "loss",
                        "value": 1.0 / (s + 1),
                        "created_at": now,
                        "attempt": claim.attempt,
                    }
                    for s in range(head, rows)
                ],
            )
    return claim


def median_ms(client: httpx.Client, path: str, params: dict[str, str | int], repeat: int) -> float:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(path, params=params).raise_for_status()
        timings.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(timings), 2)


# --- 50 pollers -------------------------------------------------------------------------------------


async def pollers(
    base: str, headers: dict[str, str], job_id: int, cursor: int, server: psutil.Process
) -> dict[str, float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + CROWD_SECONDS

    async def poll(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            response = await client.get(f"/v1/jobs/{job_id}/metrics", params={"after": cursor, "limit": 1000})
            response.raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)

    # The API's background threads (rate-count flush, search driver, webhook dispatcher, outage
    # watch) spend CPU whether or not anyone polls; on a loaded machine the pollers make few
    # requests, and that CPU spread over them would read as a cost per poll. Measured idle first.
    idle_before = sum(server.cpu_times()[:2])
    await asyncio.sleep(IDLE_SECONDS)
    idle_cpu_per_s = (sum(server.cpu_times()[:2]) - idle_before) / IDLE_SECONDS
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits, headers=headers) as client:
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
        "api_idle_cpu_ms_per_s": round(1000 * idle_cpu_per_s, 2),
        "api_cpu_ms_per_poll_net_of_idle": round(1000 * (cpu - idle_cpu_per_s * elapsed) / len(latencies), 2),
        "poll_p50_ms": percentile(latencies, 0.50),
        "poll_p99_ms": percentile(latencies, 0.99),
    }


# --- 50 streams -------------------------------------------------------------------------------------


async def streams(
    base: str,
    headers: dict[str, str],
    db: Database,
    claim: Claim,
    resume_from: str,
    server: psutil.Process,
    seconds: float,
    count: int,
) -> dict[str, Any]:
    job_id = claim.job_id
    committed: dict[int, float] = {}  # step → when its row was committed
    lags: list[float] = []
    first_seen: dict[int, float] = {}  # step → when the first of the streams received it
    ready = asyncio.Event()
    opened = 0

    async def listen(client: httpx.AsyncClient) -> None:
        nonlocal opened
        resume = {"Last-Event-ID": resume_from}
        async with client.stream("GET", f"/v1/jobs/{job_id}/stream", headers=resume) as response:
            response.raise_for_status()
            opened += 1
            if opened == count:
                ready.set()
            event = None
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "metric":
                    step = json.loads(line[6:])["step"]
                    if step in committed:
                        now = time.time()
                        lags.append((now - committed[step]) * 1000)
                        first_seen.setdefault(step, now)
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

    limits = httpx.Limits(max_connections=count + 5, max_keepalive_connections=count + 5)
    async with httpx.AsyncClient(
        base_url=base, timeout=httpx.Timeout(60, read=None), limits=limits, headers=headers
    ) as client:
        listeners = [asyncio.create_task(listen(client)) for _ in range(count)]
        # A stream the API refused ends its task with the error: raise it rather than wait for the
        # 50th stream that will never open.
        opening = asyncio.create_task(ready.wait())
        await asyncio.wait([opening, *listeners], timeout=60, return_when=asyncio.FIRST_COMPLETED)
        for listener in listeners:
            if listener.done():
                listener.result()
        if not ready.is_set():
            raise SystemExit(f"only {opened} of {count} streams opened within 60 s")
        await asyncio.sleep(1.0)  # settled: every stream has made its first read
        stop = threading.Event()
        writer = threading.Thread(target=write, args=(stop,), daemon=True)
        cpu_before = sum(server.cpu_times()[:2])
        started = time.perf_counter()
        writer.start()
        await asyncio.sleep(seconds)
        stop.set()
        writer.join()
        await asyncio.sleep(2.0)  # the last rows' delivery
        elapsed = time.perf_counter() - started
        cpu = sum(server.cpu_times()[:2]) - cpu_before
        # End the job: every stream then closes by itself.
        with db.session() as session:
            jobs_repo.finish_job(session, claim=claim, status=JobStatus.cancelled)
        await asyncio.wait_for(asyncio.gather(*listeners), 30)
    first = [(seen - committed[step]) * 1000 for step, seen in first_seen.items()]
    started_at = min(committed.values())
    # The rows the first stream received last, with when (s into the run) they were committed: a
    # tail that clusters at the start, or at a period, points at its cause.
    timed = [(seen - committed[step], committed[step] - started_at) for step, seen in first_seen.items()]
    slowest = [(round(lag * 1000, 1), round(at, 2)) for lag, at in sorted(timed, reverse=True)[:5]]
    return {
        "streams": count,
        "rows_written": len(committed),
        "rows_delivered": len(lags),
        "stream_lag_p50_ms": percentile(lags, 0.50),
        "stream_lag_p99_ms": percentile(lags, 0.99),
        # The first of the 50 to receive each row: the reader's wake-up and read, before the fan-out
        # and this process's own parsing of 50 copies (which a starved client adds to the lag).
        "first_stream_lag_p50_ms": percentile(first, 0.50),
        "first_stream_lag_p99_ms": percentile(first, 0.99),
        "first_stream_slowest_ms_at_s": slowest,
        "api_cpu_percent_per_stream": round(100 * cpu / elapsed / count, 3),
        "api_cpu_percent_50_streams": round(100 * cpu / elapsed, 1),
    }


# --- the floor -------------------------------------------------------------------------------------


def floor_ms_per_poll() -> float:
    """The bare framework's API CPU per poll on this machine, now (../shared/tools/bare_api_floor.py).
    Tried twice: on a loaded machine its clients can lose the race with its server's 5 s keep-alive
    close (a RemoteProtocolError ends that run; it is the kit's tool, left as it is)."""
    for attempt in (1, 2):
        # Its output goes to a file, not a pipe: the floor's own server inherits its stdout, and a
        # pipe it held open would keep this call waiting after the script ended.
        with tempfile.TemporaryFile("w+") as output:
            command = [sys.executable, str(FLOOR), "--requests", str(FLOOR_REQUESTS)]
            # A session of its own: a floor that fails leaves its server running; its group goes.
            floor = subprocess.Popen(command, stdout=output, cwd=REPO, start_new_session=True)
            try:
                floor.wait(600)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(floor.pid, signal.SIGTERM)
            finished = floor
            if finished.returncode == 0:
                output.seek(0)
                figures: dict[str, Any] = json.loads(output.read().strip().splitlines()[-1])
                return float(figures["api_cpu_ms_per_poll"])
        note(f"floor failed (try {attempt})", finished.returncode)
    raise SystemExit("the bare-framework floor failed twice")


# --- the API as a process of its own ----------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--postgres", default=None, help="a Postgres server's URL: each run uses a scratch database there"
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument(
        "--before", type=Path, default=None, help="another checkout whose API to measure first"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="run the API under cProfile (bench/profiled_api.py), measure the pollers alone, and write "
        "the API's pstats there (its top functions go to the API's log, printed at the end)",
    )
    parser.add_argument(
        "--stream-seconds",
        type=float,
        default=STREAM_SECONDS,
        help="how long the writer adds a row every 100 ms while the 50 streams follow the job",
    )
    parser.add_argument(
        "--streams", type=int, default=CLIENTS, help="how many streams follow the job (1: no fan-out)"
    )
    parser.add_argument(
        "--pin-api",
        action="store_true",
        help="the API's threads on the first CPU, this process and the Postgres server on the others: "
        "whether a lag's tail is the API's or the machine's (the benchmark's clients and writer, and "
        "the database, competing with the API for two cores)",
    )
    parser.add_argument(
        "--parts",
        default="reads,polls,streams",
        help="which parts to run: reads (one client), polls (the pollers and the floor), streams",
    )
    args = parser.parse_args()
    # A timeout's SIGTERM unwinds the run (SystemExit): the API is stopped and the scratch database
    # dropped, instead of an API left serving after the run that started it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for label, source in (("before", args.before), ("after", None)):
        if label == "before" and source is None:
            continue
        figures = run(args, source)
        figures["api"] = label if args.before else "this checkout"
        print(json.dumps(figures), flush=True)
    return 0


def run(args: argparse.Namespace, source: Path | None) -> dict[str, object]:
    """Every measurement against the API of `source` (a checkout; None: this one), on a fresh database."""
    with ExitStack() as cleanup:
        root = cleanup.enter_context(run_folder("gluejobs-poll-"))
        url = None
        if args.postgres:
            url = cleanup.enter_context(scratch_postgres(args.postgres, f"bench_poll_{os.getpid()}"))
        # 50 streams of one key: above the default cap (20 per key), which would refuse 30 of them.
        cap = max(CLIENTS, args.streams)
        settings = bench_settings(
            root, database_url=url, rate_reads_per_minute=READS_PER_MINUTE, max_streams_per_key=cap
        )
        db = Database(settings.database_url)
        cleanup.callback(db.dispose)
        upgrade(db)
        with db.session() as session:
            _, secret = api_keys.create_key(
                session, owner="bench", role=KeyRole.admin, name="bench", expires_at=None, actor=None
            )
        small_claim, large_claim = fill(db, 10), fill(db, args.rows)
        # --app-dir: the checkout's modules come first on the API's path.
        # A keep-alive of a minute: a poller starved of CPU on a loaded machine may take longer than
        # uvicorn's default 5 s to send its next request, and the race with the server's close of
        # the idle connection ended a run with a ReadError.
        command: tuple[str, ...] = (
            *QUIET_API,
            "--timeout-keep-alive",
            "60",
            "--app-dir",
            str(source or REPO),
        )
        if args.profile:  # the same uvicorn arguments, under the profiler
            profiled = (sys.executable, str(REPO / "bench" / "profiled_api.py"), str(args.profile), "--")
            command = (*profiled, *command[3:])
        with local_stack(
            settings, logs=root / "logs", workers=0, migrate=False, api_command=command
        ) as stack:
            assert stack.api is not None
            headers = {"Authorization": f"Bearer {secret}"}
            server = psutil.Process(stack.api.pid)
            if args.pin_api:
                cleanup.callback(pin_api(server))
            if not args.profile:
                return measure(stack.url, headers, db, server, small_claim, large_claim, args)
            large = large_claim.job_id
            first = httpx.get(
                f"{stack.url}/v1/jobs/{large}/metrics", params={"limit": 1}, headers=headers
            ).json()["data"][0]["id"]
            figures = asyncio.run(pollers(stack.url, headers, large, first + args.rows - 11, server))
        # The API has ended (its profile written): its log holds the top functions.
        print((root / "logs" / "api.log").read_text(), file=sys.stderr)
        return {"benchmark": "api-polling", "database": db.dialect, "profiled": str(args.profile), **figures}


def pin_api(server: psutil.Process) -> Callable[[], None]:
    """`--pin-api`: every thread of the API on CPU 0 (threads it starts later inherit it); this process
    and every Postgres process on the rest. Linux only (sched_setaffinity per thread). Returns what
    puts every thread it moved back: Postgres's postmaster passes its affinity to every backend it
    starts later, so a pin left behind would outlive the run."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin-api needs two CPUs or more")
    api, rest = {cpus[0]}, set(cpus[1:])
    moved: dict[int, set[int]] = {}

    def pin(threads: list[Any], to: set[int]) -> None:
        for thread in threads:
            with contextlib.suppress(OSError):  # a thread that has ended meanwhile
                moved.setdefault(thread.id, os.sched_getaffinity(thread.id))
                os.sched_setaffinity(thread.id, to)

    pin(server.threads(), api)
    pin(psutil.Process().threads(), rest)
    for process in psutil.process_iter(["name"]):
        if process.info["name"] and process.info["name"].startswith("postgres"):
            with contextlib.suppress(psutil.Error):
                pin(process.threads(), rest)
    note("pinned", {"api_cpus": sorted(api), "others_cpus": sorted(rest), "threads": len(moved)})

    def restore() -> None:
        for thread_id, affinity in moved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(thread_id, affinity)

    return restore


def measure(
    base: str,
    headers: dict[str, str],
    db: Database,
    server: psutil.Process,
    small: Claim,
    large: Claim,
    args: argparse.Namespace,
) -> dict[str, object]:
    figures: dict[str, object] = {"benchmark": "api-polling", "database": db.dialect, "rows": args.rows}
    parts = {part.strip() for part in args.parts.split(",")}
    with httpx.Client(base_url=base, timeout=30, headers=headers) as client:
        for label, job_id, rows in (
            ("10_rows", small.job_id, 10),
            (f"{args.rows}_rows", large.job_id, args.rows),
        ):
            first_id = client.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 1}).json()["data"][0]["id"]
            if "reads" not in parts:
                continue
            cursor = first_id + rows - 10  # a poller that has seen all but the newest ten rows
            figures[f"job_ms_{label}"] = median_ms(client, f"/v1/jobs/{job_id}", {}, args.repeat)
            figures[f"metrics_after_ms_{label}"] = median_ms(
                client, f"/v1/jobs/{job_id}/metrics", {"after": cursor, "limit": 1000}, args.repeat
            )
            figures[f"events_ms_{label}"] = median_ms(client, f"/v1/jobs/{job_id}/events", {}, args.repeat)
        last_metric = first_id + args.rows - 1
        last_event = client.get(f"/v1/jobs/{large.job_id}/events").json()["data"][-1]["id"]
    figures["machine_load_1min"] = round(os.getloadavg()[0], 1)
    note("single-client reads", figures)
    if "polls" in parts:
        floor_before = floor_ms_per_poll()
        note("floor (before)", floor_before)
        polled = asyncio.run(pollers(base, headers, large.job_id, last_metric - 10, server))
        figures.update(polled)
        note("pollers", figures)
        floor_after = floor_ms_per_poll()
        note("floor (after)", floor_after)
        floor = (floor_before + floor_after) / 2
        figures["floor_api_cpu_ms_per_poll"] = round(floor, 2)
        figures["floor_before_after_ms"] = [round(floor_before, 2), round(floor_after, 2)]
        figures["api_cpu_per_poll_over_floor"] = round(polled["api_cpu_ms_per_poll"] / floor, 2)
        figures["net_of_idle_over_floor"] = round(polled["api_cpu_ms_per_poll_net_of_idle"] / floor, 2)
    if "streams" in parts:
        resume = f"{last_metric}.{last_event}"
        followed = streams(base, headers, db, large, resume, server, args.stream_seconds, args.streams)
        figures.update(asyncio.run(followed))
    figures["load_average"] = load_average()
    figures["api_pinned"] = args.pin_api
    return figures


def note(phase: str, figures: object) -> None:
    """Progress on stderr, so that a run that stops shows where."""
    print(f"[{time.strftime('%H:%M:%S')}] {phase}: {json.dumps(figures)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
