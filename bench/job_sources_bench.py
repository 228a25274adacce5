"""A job's model as the start of the next job (issue 33 items 1 and 4): what `job:N` and promote cost
the API, and a chained job's first step against a job from a registered model of the same size.

    python bench/job_sources_bench.py            # moto's S3 on 127.0.0.1 (tests/support/s3_endpoint.py)
    python bench/job_sources_bench.py --store local

One stack (SQLite, the API, no worker: gluejobs_server/stack.py). The source job is a job finished as a
worker finishes one (tests/dbutil.finish_as_a_worker) whose folder in the store holds MiniLM's files
(92 MB; no model in the store holds them yet) and the manifest a worker writes beside them
(worker/training/model_manifest.py: timed here as well). Timed from the client's side: the first `job:N`
submission (the store copies the files to their blobs), a second one (the model is pinned already),
promote (`POST /v1/jobs/{id}/model`), a `model:NAME` submission, and promote of a model saved before
workers wrote manifests (the API hashes the files, read from the store). Then one job from `job:N`
and one from MiniLM registered through the API, each run by a worker of its own with an empty cache
(another machine), two steps: the claim to the first training row (the worker fetches the model by
hash, checks it and loads it). One JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_settings, load_average, run_folder
from gluejobs import Client
from gluejobs_server.demo import demo_model_folder, install_demo_files, register_demo_model
from gluejobs_server.stack import local_stack, stack_environment, start_worker, stop
from shared.core.db import Database
from shared.core.storage import open_store
from shared.wire.job_folder import MANIFEST_NAME, job_key
from tests.support.dbutil import finish_as_a_worker
from tests.support.s3_endpoint import S3Endpoint
from worker.training.model_manifest import write_model_manifest

SPEC = {"task_name": "sst2", "max_train_samples": 64, "per_device_train_batch_size": 8}
STEPS = {"max_train_steps": 2, "eval_strategy": "no", "save_strategy": "no", "logging_steps": 1, "seed": 1}


def _timed(what: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = what()
    return result, round(time.perf_counter() - started, 3)


def _first_step_s(client: Client, env: dict[str, str], root: Path, name: str, model: str) -> float:
    """A job from `model` run by a worker with a cache of its own: its claim to its first training row."""
    job = client.jobs.create({**SPEC, **STEPS, "model_name_or_path": model})
    machine = {**env, "GLUEJOBS_CACHE_DIR": str(root / f"{name}-cache")}
    worker = start_worker(machine, "--exit-when-idle", log=root / "logs" / f"{name}.log")
    try:
        finished = client.jobs.wait(job.id, timeout=900, poll_interval=0.3)
    finally:
        stop(worker)
    if finished.status != "succeeded":
        raise SystemExit(f"job {job.id} from {model} {finished.status}: {finished.error}")
    first = next(m for m in client.jobs.metrics(job.id, split="train") if m.created_at)
    assert finished.started_at is not None and first.created_at is not None
    return round((first.created_at - finished.started_at).total_seconds(), 2)


def run(store: str) -> dict[str, Any]:
    with run_folder("gluejobs-job-sources-") as root:
        endpoint = S3Endpoint(root / "moto.log") if store == "s3" else None
        try:
            overrides = {"storage_url": "s3://bench/store"} if endpoint else {}
            settings = bench_settings(root, check_data_on_submit=False, **overrides)
            settings.data_dir.mkdir(parents=True, exist_ok=True)
            install_demo_files(settings)
            aws = endpoint.environment() if endpoint else {}
            env = stack_environment(settings, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **aws)
            with (
                local_stack(settings, logs=root / "logs", env=env, workers=0) as stack,
                Client(stack.url) as client,
            ):
                os.environ.update(aws)  # this process writes the source job's folder into the store
                objects = open_store(settings)
                # The source job's spec names MiniLM as a local folder: registered only later, so that
                # the first job:N copies every file (a registered MiniLM would hold the same blobs).
                folder = settings.models_dir / "minilm"
                shutil.copytree(demo_model_folder(settings), folder)
                files, manifest_s = _timed(lambda: write_model_manifest(folder))
                source = client.jobs.create({**SPEC, "model_name_or_path": "minilm"}).id
                for path in folder.iterdir():
                    objects.put(path, job_key(source, path.name))
                finish_as_a_worker(Database(settings.database_url), source, {"accuracy": 0.5})

                spec = {**SPEC, "model_name_or_path": f"job:{source}"}
                _, first_submit_s = _timed(lambda: client.jobs.create(spec))
                _, pinned_submit_s = _timed(lambda: client.jobs.create(spec))
                _, promote_s = _timed(lambda: client.models.promote(source, name="promoted"))
                registered = register_demo_model(client, settings)
                _, named_submit_s = _timed(
                    lambda: client.jobs.create({**SPEC, "model_name_or_path": registered})
                )
                objects.delete(job_key(source, MANIFEST_NAME))
                _, hashed_promote_s = _timed(lambda: client.models.promote(source, name="hashed"))
                for job in client.jobs.list(status="queued"):
                    client.jobs.cancel(job.id)

                chained = _first_step_s(client, env, root, "chained", f"job:{source}")
                from_registered = _first_step_s(client, env, root, "registered", registered)
            return {
                "store": store,
                "model_mb": round(sum(f.bytes for f in files) / 1e6, 1),
                "worker_manifest_s": manifest_s,
                "submit_job_n_first_s": first_submit_s,
                "submit_job_n_pinned_s": pinned_submit_s,
                "promote_s": promote_s,
                "submit_model_name_s": named_submit_s,
                "promote_without_manifest_s": hashed_promote_s,
                "claim_to_first_step_job_n_s": chained,
                "claim_to_first_step_model_name_s": from_registered,
                "load_average": load_average(),
            }
        finally:
            if endpoint is not None:
                endpoint.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=("s3", "local"), default="s3")
    print(json.dumps(run(parser.parse_args().store)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
