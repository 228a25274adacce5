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
# A job a worker runs in seconds: SST-2's first 32 rows, two steps, no evaluation, no checkpoint.
QUICK_JOB: dict[str, Any] = {
    "model_name_or_path": "tiny-bert",
    "task_name": "sst2",
    "max_train_samples": 32,
    "max_eval_samples": 16,
    "per_device_train_batch_size": 16,
    "num_train_epochs": 1,
    "save_strategy": "no",
    "eval_strategy": "no",
}


# roberta-base's shape (as a BERT encoder), for the GPU speed run.
ROBERTA_BASE_SHAPE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}


def save_tiny_bert(folder: Path, tokenizer_dir: Path, **shape: int) -> Path:
    """A randomly initialised BERT backbone (no head, like a pretrained checkpoint: each job adds a
    head of its own size) over the tokenizer in `tokenizer_dir`, saved in `folder`. Two layers of
    width 32 by default, what the tests and the quick benchmarks train in seconds; `shape` sizes it
    otherwise (ROBERTA_BASE_SHAPE)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tiny = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, **{**tiny, **shape})
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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
