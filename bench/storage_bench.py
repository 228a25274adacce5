"""The store's costs (issue 15): a user's 50 MB file from upload to the job's first optimizer step,
and the upload of each MiniLM checkpoint, with the local folder and with an S3 endpoint.

    python bench/storage_bench.py                       # both stores, a 50 MB file, 3 checkpoints
    python bench/storage_bench.py --stores s3 --file-mb 20 --checkpoints 2

Per store, a stack of its own (SQLite, the API and one worker, gluejobs/stack.py) and, for S3,
moto's S3 server on 127.0.0.1 (gluejobs.stack.S3Endpoint), reached the way a MinIO is. The file is
SST-2's training rows repeated to the size asked for; the job fine-tunes all-MiniLM-L6-v2 on its
first 2,000 rows (so the training itself stays small and the figures are the file's), batch 16,
logging every step, a checkpoint every 4 steps. Timed from the client's side: hashing and sending
the file (`client.files.create`: the API checks it as it lands and stores it), the job's creation
(the API reads the file to check it against the spec), and the first training metric row (the
worker has fetched the file into its cache, checked its sha256, read and tokenised the rows). Per
checkpoint, the worker's own log lines give the upload's seconds and megabytes; the job's time from
its first step to its end is printed for both stores. One JSON line per store.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import GLUE_DATA, bench_settings, load_average, run_folder  # noqa: E402
from gluejobs import Client  # noqa: E402
from gluejobs.demo import MODEL_NAME, install_demo_files  # noqa: E402
from gluejobs.stack import S3Endpoint, local_stack, stack_environment, start_worker, stop  # noqa: E402

SAVE_STEPS = 4
UPLOADED = re.compile(r"uploaded checkpoint-(\d+) \(([\d.]+) MB\) in ([\d.]+) s")
FETCHED = re.compile(r"fetched the uploaded file \w+ \(([\d.]+) MB\) from the store in ([\d.]+) s")


def write_file(path: Path, megabytes: float) -> int:
    rows = (GLUE_DATA / "SST-2" / "train.tsv").read_text().splitlines()[1:]
    written = 0
    with path.open("w") as out:
        out.write("sentence,label\n")
        while out.tell() < megabytes * 1e6:
            for line in rows:
                sentence, label = line.rsplit("\t", 1)
                out.write(f'"{sentence.replace(chr(34), "")}",{label}\n')
                written += 1
    return written


def run(store: str, megabytes: float, checkpoints: int) -> dict[str, Any]:
    with run_folder(f"gluejobs-storage-{store}-") as root:
        endpoint = S3Endpoint(root / "moto.log") if store == "s3" else None
        try:
            overrides = {"storage_url": "s3://bench/store"} if endpoint else {}
            settings = bench_settings(root, **overrides)
            settings.data_dir.mkdir(parents=True, exist_ok=True)
            install_demo_files(settings)
            train = root / "upload.csv"
            rows = write_file(train, megabytes)
            dev = root / "dev.csv"
            dev.write_text("\n".join(train.read_text().splitlines()[:201]) + "\n")
            aws = endpoint.environment() if endpoint else {}
            env = stack_environment(settings, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **aws)
            # With S3 the worker is another machine: folders of its own (its cache without the file);
            # the local store is one machine's (or a shared disk's) folder.
            machine = (
                {
                    "GLUEJOBS_ARTIFACTS_DIR": str(root / "worker"),
                    "GLUEJOBS_CACHE_DIR": str(root / "worker-cache"),
                }
                if endpoint
                else {}
            )
            with (
                local_stack(settings, logs=root / "logs", env=env, workers=0) as stack,
                Client(stack.url) as client,
            ):
                worker = start_worker({**env, **machine}, log=root / "logs" / "worker-0.log")
                try:
                    timings = _timed_job(client, train, dev, checkpoints)
                finally:
                    stop(worker)
            finished, upload_s, submitted_s, first_step_s, train_s, log = timings
            uploads = [(float(mb), float(s)) for _, mb, s in UPLOADED.findall(log)]
            fetches = [(float(mb), float(s)) for mb, s in FETCHED.findall(log)]
            return {
                "store": store,
                "file_mb": round(train.stat().st_size / 1e6, 1),
                "file_rows": rows,
                "status": finished.status,
                "upload_and_check_s": round(upload_s, 2),
                "submit_s": round(submitted_s - upload_s, 2),
                "submit_to_first_step_s": round(first_step_s, 2),
                "first_step_to_end_s": round(train_s, 2),
                "checkpoints": checkpoints,
                "checkpoint_mb": round(uploads[0][0], 1) if uploads else None,
                "checkpoint_upload_s": [s for _, s in uploads],
                "worker_fetch_s": [s for _, s in fetches],
                "load_average": load_average(),
            }
        finally:
            if endpoint is not None:
                endpoint.close()


def _timed_job(
    client: Client, train: Path, dev: Path, checkpoints: int
) -> tuple[Any, float, float, float, float, str]:
    """(the finished job, seconds to upload, to submit, to the first step, first step to end, its log)."""
    _wait_idle(client)
    started = time.perf_counter()
    uploaded = client.files.create(train)
    upload_s = time.perf_counter() - started
    dev_file = client.files.create(dev, purpose="validation")
    spec = {
        "model_name_or_path": MODEL_NAME,
        "train_file": uploaded.id,
        "validation_file": dev_file.id,
        "max_train_samples": 2000,
        "per_device_train_batch_size": 16,
        "max_train_steps": SAVE_STEPS * checkpoints,
        "save_strategy": "steps",
        "save_steps": SAVE_STEPS,
        "eval_strategy": "no",
        "logging_steps": 1,
        "seed": 1,
    }
    job = client.jobs.create(spec)
    submitted_s = time.perf_counter() - started
    while not any(m.split == "train" for m in client.jobs.metrics(job.id)):
        time.sleep(0.2)
    first_step_s = time.perf_counter() - started
    finished = client.jobs.wait(job.id, timeout=1800, poll_interval=0.5)
    train_s = time.perf_counter() - started - first_step_s
    return finished, upload_s, submitted_s, first_step_s, train_s, client.jobs.logs(job.id)


def _wait_idle(client: Client) -> None:
    """The worker registered and its warm-start template ready (it claims only then)."""
    deadline = time.monotonic() + 300
    while not any(w.state == "idle" for w in client.workers.list()):
        if time.monotonic() > deadline:
            raise SystemExit("the worker did not start")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", default="local,s3", help="local, s3, or both (comma-separated)")
    parser.add_argument("--file-mb", type=float, default=50.0)
    parser.add_argument("--checkpoints", type=int, default=3)
    args = parser.parse_args()
    for store in args.stores.split(","):
        print(json.dumps(run(store.strip(), args.file_mb, args.checkpoints)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
