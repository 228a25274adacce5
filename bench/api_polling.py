"""Does polling stay fast while metric rows pile up? Prints one JSON line.

One job with 10 metric rows and one with 100,000; for each, the median latency of what a dashboard
polls: the job, the newest metric rows (`after=` a cursor near the end), and the events.

    python bench/api_polling.py
    python bench/api_polling.py --database-url postgresql+psycopg://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from service.main import create_app  # noqa: E402
from shared import jobs_repo  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.db import Database  # noqa: E402
from shared.jobs_repo import MetricRow  # noqa: E402
from shared.migrate import upgrade  # noqa: E402

SPEC = {"model_name_or_path": "bert-base-uncased", "task_name": "sst2", "seed": 1}


def fill(db: Database, rows: int) -> int:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
        for start in range(0, rows, 5000):
            batch = [
                MetricRow(epoch=s / 1000, step=s, split="train", name="loss", value=1.0 / (s + 1))
                for s in range(start, min(rows, start + 5000))
            ]
            jobs_repo.add_metrics(session, job_id=job.id, rows=batch)
    return job.id


def median_ms(client: httpx.Client, path: str, params: dict[str, str | int], repeat: int) -> float:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(path, params=params).raise_for_status()
        timings.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(timings), 2)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="gluejobs-poll-"))
    settings = Settings(
        database_url=args.database_url or f"sqlite:///{root / 'gluejobs.db'}",
        artifacts_dir=root,
        data_dir=root,
        models_dir=root,
        cache_dir=root,
    )
    db = Database(settings.database_url)
    upgrade(db)
    small, large = fill(db, 10), fill(db, args.rows)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, db), port=args.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        figures: dict[str, object] = {"benchmark": "api-polling", "database": db.dialect, "rows": args.rows}
        with httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=30) as client:
            for label, job_id, rows in (("10_rows", small, 10), (f"{args.rows}_rows", large, args.rows)):
                last = client.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 1, "after": 0}).json()
                first_id = last["data"][0]["id"]
                cursor = first_id + rows - 10  # a poller that has seen all but the newest ten rows
                figures[f"job_ms_{label}"] = median_ms(client, f"/v1/jobs/{job_id}", {}, args.repeat)
                figures[f"metrics_after_ms_{label}"] = median_ms(
                    client, f"/v1/jobs/{job_id}/metrics", {"after": cursor, "limit": 1000}, args.repeat
                )
                figures[f"events_ms_{label}"] = median_ms(
                    client, f"/v1/jobs/{job_id}/events", {}, args.repeat
                )
        print(json.dumps(figures))
    finally:
        server.should_exit = True
        thread.join(10)
        db.dispose()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
