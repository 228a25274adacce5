"""What does the rate limit's count cost a request? p50/p99 of GET /v1/jobs (one key, one keep-alive
client, sequential), with the limits on (high enough never to refuse: every request still does its
upsert) and off, on SQLite and on Postgres. Prints one JSON line per database.

    python bench/rate_limit_bench.py
    python bench/rate_limit_bench.py --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import bench_settings, load_average, percentile, run_folder  # noqa: E402
from gluejobs import stack  # noqa: E402
from shared.db import Database  # noqa: E402
from shared.migrate import upgrade  # noqa: E402

KEY = "bench-rate-limit-key-000001"
WARMUP = 50


def latencies_ms(root: Path, database_url: str, *, limits: bool, requests: int) -> list[float]:
    on = {"rate_reads_per_minute": 10**9, "rate_submits_per_minute": 10**9}
    off = {"rate_reads_per_minute": 0, "rate_submits_per_minute": 0}
    settings = bench_settings(root, database_url=database_url, api_keys=[KEY], **(on if limits else off))
    port = stack.free_port()
    process = stack.start_api(stack.stack_environment(settings), port=port, log=root / "api.log")
    try:
        url = f"http://127.0.0.1:{port}"
        stack.wait_ready(url, process=process, log=root / "api.log", path="/healthz")
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as client:
            times = []
            for i in range(WARMUP + requests):
                started = time.perf_counter()
                client.get("/v1/jobs").raise_for_status()
                if i >= WARMUP:
                    times.append((time.perf_counter() - started) * 1000)
            return times
    finally:
        stack.stop(process)


def measure(name: str, database_url: str, root: Path, requests: int) -> dict[str, object]:
    upgrade(db := Database(database_url))
    db.dispose()
    figures: dict[str, object] = {"database": name, "requests": requests, "load": load_average()}
    for limits in (False, True, False, True):  # alternated, so a change of the machine's load shows
        times = latencies_ms(root, database_url, limits=limits, requests=requests)
        key = "on" if limits else "off"
        figures.setdefault(key, []).append(
            {"p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99)}
        )  # type: ignore[union-attr]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    with run_folder("gluejobs-rate-") as root:
        print(json.dumps(measure("sqlite", f"sqlite:///{root / 'gluejobs.db'}", root, args.requests)))
    admin_url = make_url(args.postgres_url)
    name = f"gluejobs_rate_bench_{int(time.time())}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        with run_folder("gluejobs-rate-") as root:
            url = admin_url.set(database=name).render_as_string(hide_password=False)
            print(json.dumps(measure("postgres", url, root, args.requests)))
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
