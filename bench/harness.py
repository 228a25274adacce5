"""What the benchmarks share: their settings, a job run through the API, and their statistics.

They start their stack with gluejobs_server/stack.py's local_stack (the same harness as `gluejobs demo`
and the end-to-end tests), with the tests' settings, tiny model and quick job (tests/support/kit.py).
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

# What the tests share with the benchmarks lives in the tests' kit (bench imports tests, never the
# reverse): the repository, the GLUE kit, the quick job, a stack's settings and the tiny model.
from tests.support.kit import GLUE_DATA as GLUE_DATA
from tests.support.kit import QUICK_JOB as QUICK_JOB
from tests.support.kit import REPO as REPO
from tests.support.kit import save_tiny_bert as save_tiny_bert
from tests.support.kit import stack_settings

bench_settings = stack_settings  # the benchmarks' name for it
FINISHED = ("succeeded", "failed", "cancelled")
# The API without an access log line a request (`gluejobs serve` logs one), which would count in the
# API's CPU per request that the API benchmarks measure.
QUIET_API = (sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory", "--log-level=warning")


# roberta-base's shape (as a BERT encoder), for the GPU speed run.
ROBERTA_BASE_SHAPE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}


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


@contextmanager
def scratch_postgres(admin_url: str, name: str) -> Iterator[str]:
    """A fresh, empty Postgres database `name` on the server of `admin_url` (its URL), dropped
    afterwards with whatever connections are still open to it."""
    from sqlalchemy import create_engine, make_url, text

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
