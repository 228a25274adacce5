"""SST-2 benchmark through the real API and worker; prints one JSON line.

The job: the first 8000 rows of SST-2's train.tsv, 1 epoch, all-MiniLM-L6-v2, max_length 128,
per_device_train_batch_size 32, learning_rate 5e-5, seed 42, evaluated on the 872 dev rows —
the run the reference script (run_glue_no_trainer.py) is measured on.

    python bench/sst2_bench.py                      # the job as the reference runs it
    python bench/sst2_bench.py --group-by-length    # the same job with length-bucketed batches
    python bench/sst2_bench.py --database-url postgresql+psycopg://postgres@127.0.0.1/test

Each run starts from an empty folder (a cold tokenisation cache, like the script), starts an API
and an idle worker, then times from the POST to the job's success.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
GLUE_DATA = REPO.parent / "shared" / "glue_data"
sys.path.insert(0, str(REPO))

from gluejobs.demo import MODEL_NAME, install_demo_files  # noqa: E402
from shared.config import Settings  # noqa: E402
from worker.runner import child_environment  # noqa: E402


def bench_spec(args: argparse.Namespace) -> dict[str, object]:
    return {
        "model_name_or_path": MODEL_NAME,
        "task_name": "sst2",
        "max_train_samples": 8000,
        "num_train_epochs": 1,
        "max_length": 128,
        "per_device_train_batch_size": 32,
        "learning_rate": 5e-5,
        "seed": 42,
        "group_by_length": args.group_by_length,
        "save_strategy": "no" if args.no_save else "epoch",
        "logging_steps": 10,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--group-by-length", action="store_true")
    parser.add_argument("--no-save", action="store_true", help="no end-of-epoch checkpoint")
    parser.add_argument("--database-url", default=None, help="default: a SQLite file in the run's folder")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="gluejobs-bench-"))
    settings = Settings(
        database_url=args.database_url or f"sqlite:///{root / 'gluejobs.db'}",
        artifacts_dir=root / "artifacts",
        data_dir=root / "data",
        glue_dir=GLUE_DATA,
        models_dir=root / "models",
        cache_dir=root / "cache",
        heartbeat_s=5.0,
        poll_interval_s=0.5,
    )
    install_demo_files(settings)
    env = child_environment(settings)
    env["HF_HUB_OFFLINE"] = "1"
    logs = root / "logs"
    logs.mkdir()
    processes = []
    try:
        subprocess.run(
            [sys.executable, "-m", "gluejobs.cli", "migrate"],
            env=env,
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        processes.append(
            _start(
                [sys.executable, "-m", "gluejobs.cli", "serve", "--port", str(args.port)],
                env,
                logs / "api.log",
            )
        )
        processes.append(_start([sys.executable, "-m", "gluejobs.cli", "worker"], env, logs / "worker.log"))
        url = f"http://127.0.0.1:{args.port}"
        _wait_ready(url)
        with httpx.Client(base_url=url, timeout=30) as client:
            submitted = time.perf_counter()
            job = client.post("/v1/jobs", json={"spec": bench_spec(args)}).raise_for_status().json()
            while job["status"] not in ("succeeded", "failed", "cancelled"):
                time.sleep(0.5)
                job = client.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
            wall_s = time.perf_counter() - submitted
        if job["status"] != "succeeded":
            print(json.dumps({"status": job["status"], "error": job["error"]}))
            return 1
        result = job["result"]
        print(
            json.dumps(
                {
                    "benchmark": "sst2-8000-minilm",
                    "group_by_length": args.group_by_length,
                    "database": settings.database_url.split(":")[0],
                    "train_samples": result["train_samples"],
                    "train_samples_per_second": result["train_samples_per_second"],
                    "train_runtime_s": result["train_runtime_s"],
                    "padded_tokens": result["padded_tokens"],
                    "real_tokens": result["real_tokens"],
                    "wall_s_submit_to_success": round(wall_s, 1),
                    "worker_peak_rss_mb": result["peak_rss_mb"],
                    "dev_accuracy": result["final_metrics"]["accuracy"],
                    "torch_threads": _torch_threads(),
                }
            )
        )
        return 0
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}", file=sys.stderr)


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command, env=env, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"the API at {url} did not become ready")


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
