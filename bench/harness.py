"""What the benchmarks share: their settings, a job run through the API, and their statistics.

They start their stack with gluejobs/stack.py's local_stack (the same harness as `gluejobs demo`
and the end-to-end tests).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from shared.config import Settings

REPO = Path(__file__).resolve().parent.parent
# The real GLUE rows of the kit beside the repository (SST-2/train.tsv …).
GLUE_DATA = REPO.parent / "shared" / "glue_data"
FINISHED = ("succeeded", "failed", "cancelled")
# The API without an access log line a request (`gluejobs serve` logs one), which would count in the
# API's CPU per request that the API benchmarks measure.
QUIET_API = (sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory", "--log-level=warning")


@contextmanager
def run_folder(prefix: str, *, keep: bool = False) -> Iterator[Path]:
    """An empty folder for one run (its database, files and logs), removed afterwards unless `keep`."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        if keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def bench_settings(root: Path, *, database_url: str | None = None, **overrides: Any) -> Settings:
    """A stack of its own under `root`: a SQLite database there (unless `database_url`), its
    artifacts, data, models and tokenisation cache, the kit's GLUE rows, quick polling."""
    values: dict[str, Any] = {
        "database_url": database_url or f"sqlite:///{root / 'gluejobs.db'}",
        "artifacts_dir": root / "artifacts",
        "data_dir": root / "data",
        "glue_dir": GLUE_DATA,
        "models_dir": root / "models",
        "cache_dir": root / "cache",
        "heartbeat_s": 5.0,
        "poll_interval_s": 0.5,
    }
    return Settings(**{**values, **overrides})


def run_job(client: httpx.Client, spec: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """POST the job and poll it until it ends; the job as the API returns it, and the seconds from
    the POST to its end."""
    submitted = time.perf_counter()
    response = client.post("/v1/jobs", json={"spec": spec})
    if response.status_code != 201:
        raise SystemExit(f"the API refused the job ({response.status_code}): {response.text}")
    job: dict[str, Any] = response.json()
    while job["status"] not in FINISHED:
        time.sleep(0.5)
        job = client.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
    return job, time.perf_counter() - submitted


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (`share` of 1), to two decimals."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2)


def load_average() -> str:
    """The machine's load averages (1, 5, 15 min): the figures of a shared machine follow them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
