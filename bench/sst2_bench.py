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
import sys
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import bench_settings, run_folder, run_job  # noqa: E402
from gluejobs_server.demo import MODEL_NAME, install_demo_files  # noqa: E402
from gluejobs_server.stack import local_stack, stack_environment  # noqa: E402


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

    with run_folder("gluejobs-bench-", keep=args.keep) as root:
        settings = bench_settings(root, database_url=args.database_url)
        install_demo_files(settings)
        env = stack_environment(settings, HF_HUB_OFFLINE="1")
        with (
            local_stack(settings, logs=root / "logs", port=args.port, env=env) as stack,
            httpx.Client(base_url=stack.url, timeout=30) as client,
        ):
            job, wall_s = run_job(client, bench_spec(args))
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


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
