"""The store's costs (issue 15): a user's 50 MB file from upload to the job's first optimizer step,
and the upload of each MiniLM checkpoint, with the local folder and with an S3 endpoint.

    python bench/storage_bench.py                       # both stores, a 50 MB file, 3 checkpoints
    python bench/storage_bench.py --stores s3 --file-mb 20 --checkpoints 2

Per store, a stack of its own (SQLite, the API and one worker, gluejobs_server/stack.py) and, for S3,
moto's S3 server on 127.0.0.1 (tests/support/s3_endpoint.py), reached the way a MinIO is. The file is
SST-2's training rows repeated to the size asked for; the job fine-tunes all-MiniLM-L6-v2 on its
first 2,000 rows (so the training itself stays small and the figures are the file's), batch 16,
logging every step, a checkpoint every 4 steps. Timed from the client's side: hashing and sending
the file (`client.files.create`: the API checks it as it lands and stores it), the job's creation
(the API reads the file to check it against the spec), and the first training metric row (the
worker has fetched the file into its cache, checked its sha256, read and tokenised the rows). Per
checkpoint, the worker's own log lines give the upload's seconds and megabytes; the job's time from
its first step to its end is printed for both stores. One JSON line per store.

    python bench/storage_bench.py --overhead --rounds 2    # checkpoint overhead: local vs S3

`--overhead` (issue 23) measures what checkpointing to the object store costs the training: the same
job (MiniLM, SST-2's training rows, the fast path, batch 16, a checkpoint every 100 steps,
`--checkpoints` of them) with the local store and with the S3 endpoint, the stores taking turns
for `--rounds` rounds so that the shared machine's load falls on both alike. Steps/s are counted
between the first and the last training row (the worker writes each as the loop reports it, so
its created_at is its step's time); each upload's seconds, and how long a save waited for the
previous upload, come from the job's log. The ratio S3/local is the figure: 1.0 means the uploads
cost the training nothing. Beside it, the first step to the job's end (`last_step_to_end_s` is the
last save and, with S3, the wait for its upload: a job ends only after its uploads), S3 over local.
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
from gluejobs_server.demo import install_demo_files, register_demo_model  # noqa: E402
from gluejobs_server.stack import local_stack, stack_environment, start_worker, stop  # noqa: E402
from tests.support.s3_endpoint import S3Endpoint  # noqa: E402

SAVE_STEPS = 4
OVERHEAD_SAVE_STEPS = 100
OVERHEAD_LOGGING_STEPS = 10
UPLOADED = re.compile(r"uploaded checkpoint-(\d+) \(([\d.]+) MB\) in ([\d.]+) s")
WAITED = re.compile(r"waited ([\d.]+) s for the upload")
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


def run(store: str, megabytes: float, checkpoints: int, *, overhead: bool = False) -> dict[str, Any]:
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
                    # MiniLM registered through the models route, as a deployment's users have it
                    # (the worker box has no GLUEJOBS_MODELS_DIR of it).
                    model = register_demo_model(client, settings)
                    if overhead:
                        return {"store": store, **_overhead_job(client, train, dev, checkpoints, model)}
                    timings = _timed_job(client, train, dev, checkpoints, model)
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
    client: Client, train: Path, dev: Path, checkpoints: int, model: str
) -> tuple[Any, float, float, float, float, str]:
    """(the finished job, seconds to upload, to submit, to the first step, first step to end, its log)."""
    _wait_idle(client)
    started = time.perf_counter()
    uploaded = client.files.create(train)
    upload_s = time.perf_counter() - started
    dev_file = client.files.create(dev, purpose="validation")
    spec = {
        "model_name_or_path": model,
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


def _overhead_job(client: Client, train: Path, dev: Path, checkpoints: int, model: str) -> dict[str, Any]:
    """The checkpoint-overhead job: its steps/s from the first to the last logged training step."""
    _wait_idle(client)
    spec = {
        "model_name_or_path": model,
        "train_file": client.files.create(train).id,
        "validation_file": client.files.create(dev, purpose="validation").id,
        "fast": True,
        "per_device_train_batch_size": 16,
        "max_train_steps": OVERHEAD_SAVE_STEPS * checkpoints,
        "save_strategy": "steps",
        "save_steps": OVERHEAD_SAVE_STEPS,
        "eval_strategy": "no",
        "logging_steps": OVERHEAD_LOGGING_STEPS,
        "seed": 1,
    }
    job = client.jobs.create(spec)
    finished = client.jobs.wait(job.id, timeout=3600, poll_interval=1.0)
    log = client.jobs.logs(job.id)
    # The worker writes each training row as the loop reports it: its created_at is the step's time.
    rows = [m for m in client.jobs.metrics(job.id, split="train", name="loss") if m.created_at]
    if len(rows) < 2:
        what = f"the job {finished.status} with {len(rows)} training rows: {finished.error}"
        raise SystemExit(f"{what}\n{log[-3000:]}")
    first, last = rows[0], rows[-1]
    assert first.created_at is not None and last.created_at is not None
    first_step, last_step = first.step, last.step
    elapsed_s = (last.created_at - first.created_at).total_seconds()
    # From the last training row to the job's end: the last checkpoint's save and, with S3, the wait
    # for its upload (a job ends only after its uploads), which steps/s between rows leaves out.
    assert finished.finished_at is not None
    tail_s = (finished.finished_at - last.created_at).total_seconds()
    return {
        "status": finished.status,
        "steps": last_step - first_step,
        "steps_per_s": round((last_step - first_step) / max(elapsed_s, 1e-9), 3),
        "first_to_last_step_s": round(elapsed_s, 1),
        "last_step_to_end_s": round(tail_s, 1),
        "checkpoint_mb": [float(mb) for _, mb, _ in UPLOADED.findall(log)][:1],
        "checkpoint_upload_s": [float(s) for _, _, s in UPLOADED.findall(log)],
        "save_waited_s": [float(s) for s in WAITED.findall(log)],
        "load_average": load_average(),
    }


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
    parser.add_argument(
        "--overhead", action="store_true", help="the checkpoint overhead: steps/s, local vs S3"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --overhead: the stores take turns this often"
    )
    args = parser.parse_args()
    stores = [store.strip() for store in args.stores.split(",")]
    if not args.overhead:
        for store in stores:
            print(json.dumps(run(store, args.file_mb, args.checkpoints)), flush=True)
        return 0
    rates: dict[str, list[float]] = {store: [] for store in stores}
    spans: dict[str, list[float]] = {store: [] for store in stores}
    for _ in range(args.rounds):
        for store in stores:
            result = run(store, 0.001, args.checkpoints, overhead=True)  # one pass of SST-2's rows
            rates[store].append(result["steps_per_s"])
            spans[store].append(result["first_to_last_step_s"] + result["last_step_to_end_s"])
            print(json.dumps(result), flush=True)
    if {"local", "s3"} <= rates.keys():
        ratios = [s3 / local for s3, local in zip(rates["s3"], rates["local"], strict=True)]
        # The training's time with its end (the last upload waited for): S3 over local.
        whole = [s3 / local for s3, local in zip(spans["s3"], spans["local"], strict=True)]
        print(
            json.dumps(
                {
                    "s3_over_local_steps_per_s": [round(r, 3) for r in ratios],
                    "s3_over_local_first_step_to_end_s": [round(r, 3) for r in whole],
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
