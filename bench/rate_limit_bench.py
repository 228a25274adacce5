"""What does the rate limit's count cost a request? p50/p99 of GET /v1/jobs (one key, one keep-alive
client each, sequential) from two API processes on one database, one with the limits on (high
enough never to refuse: every request still does its upsert) and one with them off, asked in turn;
and the count alone (RateLimits.count in this process). On SQLite and on Postgres; one JSON line per
database.

    python bench/rate_limit_bench.py
    python bench/rate_limit_bench.py --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import bench_settings, load_average, percentile, run_folder, scratch_postgres  # noqa: E402
from gluejobs_server import stack  # noqa: E402
from service.edge.rate_limits import RateLimits  # noqa: E402
from shared.core.config import Settings  # noqa: E402
from shared.core.db import Database  # noqa: E402
from shared.core.migrate import upgrade  # noqa: E402

KEY = "bench-rate-limit-key-000001"
WARMUP = 50


@contextmanager
def api(root: Path, database_url: str, *, limits: bool) -> Iterator[httpx.Client]:
    on = {"rate_reads_per_minute": 10**9, "rate_submits_per_minute": 10**9}
    off = {"rate_reads_per_minute": 0, "rate_submits_per_minute": 0}
    settings = bench_settings(root, database_url=database_url, api_keys=[KEY], **(on if limits else off))
    port = stack.free_port()
    log = root / f"api-{'on' if limits else 'off'}.log"
    process = stack.start_api(stack.stack_environment(settings), port=port, log=log)
    try:
        url = f"http://127.0.0.1:{port}"
        stack.wait_ready(url, process=process, log=log, path="/healthz")
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as client:
            yield client
    finally:
        stack.stop(process)


def timed_ms(client: httpx.Client) -> float:
    started = time.perf_counter()
    client.get("/v1/jobs").raise_for_status()
    return (time.perf_counter() - started) * 1000


def count_ms(database_url: str, calls: int) -> list[float]:
    """The count alone, in this process: RateLimits.count as the guard calls it."""
    db = Database(database_url)
    limits = RateLimits.from_settings(Settings(database_url=database_url), db)
    assert limits is not None
    times = []
    for _ in range(WARMUP + calls):
        started = time.perf_counter()
        limits.count("bench", write=False)
        times.append((time.perf_counter() - started) * 1000)
    limits.db.dispose()
    db.dispose()
    return times[WARMUP:]


def measure(name: str, database_url: str, root: Path, requests: int) -> dict[str, object]:
    """Two API processes on one database, limits off and on, asked in turn: a change of the
    machine's load falls on both alike."""
    upgrade(db := Database(database_url))
    db.dispose()
    times: dict[str, list[float]] = {"off": [], "on": []}
    with api(root, database_url, limits=False) as off, api(root, database_url, limits=True) as on:
        for i in range(WARMUP + requests):
            for key, client in (("off", off), ("on", on)) if i % 2 else (("on", on), ("off", off)):
                elapsed = timed_ms(client)
                if i >= WARMUP:
                    times[key].append(elapsed)
    count = count_ms(database_url, requests)
    figures: dict[str, object] = {"database": name, "requests": requests, "load": load_average()}
    for key, values in (*times.items(), ("count alone", count)):
        figures[key] = {"p50_ms": percentile(values, 0.5), "p99_ms": percentile(values, 0.99)}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--databases", default="sqlite,postgres", help="which of sqlite,postgres")
    args = parser.parse_args()
    if "sqlite" in args.databases:
        with run_folder("gluejobs-rate-") as root:
            print(json.dumps(measure("sqlite", f"sqlite:///{root / 'gluejobs.db'}", root, args.requests)))
    if "postgres" not in args.databases:
        return
    name = f"gluejobs_rate_bench_{int(time.time())}"
    with scratch_postgres(args.postgres_url, name) as url, run_folder("gluejobs-rate-") as root:
        print(json.dumps(measure("postgres", url, root, args.requests)))


if __name__ == "__main__":
    main()
