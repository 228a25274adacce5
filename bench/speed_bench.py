"""The faithful spec against the fast path, through the real API and worker, several seeds each.

The job (issue 10): SST-2's first 8000 train rows, 1 epoch, all-MiniLM-L6-v2, max_length 128,
per_device_train_batch_size 32, learning_rate 5e-5, evaluated on the 872 dev rows. Each mode runs
once per seed; the runs of one seed follow each other (faithful, fast, faithful, fast, …) so that a
change in the machine's load touches every mode alike. Every job starts with an empty tokenisation
cache, as the reference script does. The table gives per mode the median and the spread
(min–max) of each figure, and the medians' ratios to the first mode's.

    python bench/speed_bench.py                                  # 3 seeds × faithful + fast
    python bench/speed_bench.py --train-rows 1000 --seeds 42     # a quick look
    python bench/speed_bench.py --modes faithful,grouped,fast    # any modes of MODES
    python bench/speed_bench.py --modes script,faithful,fast     # ratios to the reference script
    python bench/speed_bench.py --gpu-roberta                    # on a GPU machine: see below

`script` runs bench/reference_script.py (run_glue_no_trainer.py's training, restated to run offline)
on the same rows and seed in a process of its own, with the worker's environment; as the first mode
it is what the ratios are taken against.

--gpu-roberta (a machine with a CUDA GPU; no network needed): a roberta-base-sized encoder
(12 layers, hidden 768, 12 heads, 3072 intermediate; randomly initialised, MiniLM's tokenizer)
fine-tuned in bf16 with the fast spec on the same rows; it reports samples/s, the padding
efficiency and the model FLOP utilisation against the GPU's peak (worker/training/throughput.py). Its dev
accuracy means nothing (random weights); the figures are about speed only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import (  # noqa: E402
    ROBERTA_BASE_SHAPE,
    bench_settings,
    load_average,
    run_folder,
    run_job,
    save_tiny_bert,
)
from gluejobs_server.demo import MODEL_NAME, demo_model_folder, install_demo_files  # noqa: E402
from gluejobs_server.stack import local_stack, stack_environment  # noqa: E402

# What each mode adds to the base job. "fast" is the spec's own switch: what it sets is in
# shared/jobspec/spec.py (FAST_SETTINGS) and in the stored spec the benchmark prints.
MODES: dict[str, dict[str, Any]] = {
    "faithful": {},
    "grouped": {"group_by_length": True},
    "grouped_bf16": {"group_by_length": True, "bf16": True},
    "fast": {"fast": True},
}
SCRIPT = "script"  # bench/reference_script.py, not a job
ROBERTA_BASE_SIZED = "roberta-base-sized"
# The figures of a job's result the table reports, and how each is printed.
FIGURES = (
    ("train_samples_per_second", "samples/s", "{:.1f}"),
    # Per CPU-second of the job's process: robust to other work on shared cores (see docs/benchmarks.md).
    ("train_samples_per_cpu_second", "samples/cpu-s", "{:.1f}"),
    ("padded_tokens", "padded tok", "{:,.0f}"),
    ("real_tokens", "real tok", "{:,.0f}"),
    ("padding_efficiency", "pad eff", "{:.3f}"),
    ("mfu", "MFU", "{:.4f}"),
    ("accuracy", "dev acc", "{:.4f}"),
    ("eval_runtime_s", "eval s", "{:.1f}"),
    ("wall_s", "wall s", "{:.1f}"),
)


def base_spec(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return {
        "model_name_or_path": ROBERTA_BASE_SIZED if args.gpu_roberta else MODEL_NAME,
        "task_name": "sst2",
        "max_train_samples": args.train_rows,
        "num_train_epochs": 1,
        "max_length": 128,
        "per_device_train_batch_size": 32,
        "learning_rate": 5e-5,
        "seed": seed,
        "save_strategy": "no",
        "logging_steps": 10,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--modes", default="faithful,fast", help=f"comma-separated, of {', '.join([SCRIPT, *MODES])}"
    )
    parser.add_argument("--seeds", default="42,43,44", help="comma-separated seeds")
    parser.add_argument("--train-rows", type=int, default=8000, help="SST-2's first N train rows")
    parser.add_argument("--gpu-roberta", action="store_true", help="a roberta-base-sized model (GPU)")
    parser.add_argument("--database-url", default=None, help="default: a SQLite file in the run's folder")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    parser.add_argument(
        "--omp-wait-policy",
        choices=("passive", "active", "inherit"),
        default="passive",
        help="OMP_WAIT_POLICY for the worker (default passive: on a machine whose cores other work "
        "shares, GNU OpenMP's spinning threads make every torch op wait for a descheduled peer; see "
        "docs/benchmarks.md, Speed); inherit: leave the environment's",
    )
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES and m != SCRIPT]
    if unknown:
        parser.error(f"unknown mode {unknown[0]!r}; expected one of {', '.join([SCRIPT, *MODES])}")
    if args.gpu_roberta and args.modes == parser.get_default("modes"):
        modes = ["fast"]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    with run_folder("gluejobs-speed-", keep=args.keep) as root:
        settings = bench_settings(root, database_url=args.database_url, poll_interval_s=0.2)
        install_demo_files(settings)
        # MiniLM as a models-folder model: the demo registers it through the API's store instead, and a
        # bare name no longer resolves offline.
        shutil.copytree(demo_model_folder(settings), settings.models_dir / MODEL_NAME, dirs_exist_ok=True)
        if args.gpu_roberta:
            # An encoder of roberta-base's size, randomly initialised, with MiniLM's tokenizer (no download).
            models = settings.models_dir
            save_tiny_bert(models / ROBERTA_BASE_SIZED, models / MODEL_NAME, **ROBERTA_BASE_SHAPE)
        env = stack_environment(settings, HF_HUB_OFFLINE="1")
        if args.omp_wait_policy != "inherit":
            env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
        print(
            f"# speed_bench {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: modes {modes}, seeds "
            f"{seeds}, {args.train_rows} train rows; load average {load_average()}; cpus {os.cpu_count()}; "
            f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', '(unset)')}",
            flush=True,
        )
        with (
            local_stack(settings, logs=root / "logs", port=args.port, env=env) as stack,
            httpx.Client(base_url=stack.url, timeout=30) as client,
        ):
            for seed in seeds:
                for mode in modes:
                    if mode == SCRIPT:
                        model = settings.models_dir / MODEL_NAME
                        run = _run_script(model, seed, args.train_rows, env)
                    else:
                        shutil.rmtree(settings.cache_dir, ignore_errors=True)  # a cold cache, like the script
                        run = _run_job(client, {**base_spec(args, seed), **MODES[mode]})
                    run.update(mode=mode, seed=seed)
                    runs[mode].append(run)
                    print(json.dumps(run), flush=True)
    print(f"# finished {time.strftime('%H:%M:%S UTC', time.gmtime())}; load average {load_average()}")
    print(table(runs))
    return 0 if all(r.get("status") == "succeeded" for rs in runs.values() for r in rs) else 1


def _run_job(client: httpx.Client, spec: dict[str, Any]) -> dict[str, Any]:
    load_before = load_average()
    job, wall_s = run_job(client, spec)
    if job["status"] != "succeeded":
        return {"status": job["status"], "error": job["error"], "load": load_before}
    result = job["result"]
    run = {key: result.get(key) for key, _, _ in FIGURES if key in result}
    run.update(
        status="succeeded",
        accuracy=result["final_metrics"]["accuracy"],
        wall_s=round(wall_s, 1),
        real_tokens_per_second=result.get("real_tokens_per_second"),
        peak_flops=result.get("peak_flops"),
        peak_flops_source=result.get("peak_flops_source"),
        device=result.get("device"),
        mixed_precision=result.get("mixed_precision"),
        load=f"{load_before} -> {load_average()}",
        spec={
            k: job["spec"][k]
            for k in (
                "fast",
                "group_by_length",
                "shuffle_length_groups",
                "bf16",
                "group_eval_by_length",
                "per_device_eval_batch_size",
                "optim",
            )
            if k in job["spec"]
        },
    )
    return run


def _run_script(model: Path, seed: int, train_rows: int, env: dict[str, str]) -> dict[str, Any]:
    """bench/reference_script.py on the same rows and seed, in the worker's environment."""
    load_before = load_average()
    command = [sys.executable, str(REPO / "bench" / "reference_script.py"), "--model", str(model)]
    command += ["--seed", str(seed), "--train-rows", str(train_rows)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"status": "failed", "error": done.stderr[-2000:], "load": load_before}
    return {**json.loads(lines[-1]), "load": f"{load_before} -> {load_average()}"}


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Median [min–max] of each figure per mode, and the medians' ratios to the first mode's."""
    done = {mode: [r for r in rs if r.get("status") == "succeeded"] for mode, rs in runs.items()}
    medians = {
        mode: {
            key: statistics.median(r[key] for r in rs)
            for key, _, _ in FIGURES
            if all(r.get(key) is not None for r in rs)
        }
        for mode, rs in done.items()
        if rs
    }
    lines = [
        "| mode | runs | " + " | ".join(label for _, label, _ in FIGURES) + " |",
        "|---" * (len(FIGURES) + 2) + "|",
    ]
    for mode, rs in done.items():
        cells = []
        for key, _, fmt in FIGURES:
            values = [r[key] for r in rs if r.get(key) is not None]
            if not values:
                cells.append("–")
                continue
            low, mid, high = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
            cells.append(f"{mid} [{low}–{high}]")
        lines.append(f"| {mode} | {len(rs)}/{len(runs[mode])} | " + " | ".join(cells) + " |")
    reference = next(iter(medians), None)
    if reference is not None:
        lines.append("")
        lines.append(f"ratios of medians to {reference}:")
        for mode, values in medians.items():
            parts = []
            for key, label, _ in FIGURES:
                if key in values and values[key] and key in medians[reference] and medians[reference][key]:
                    if key == "accuracy":
                        parts.append(f"dev acc {100 * (values[key] - medians[reference][key]):+.2f} points")
                    else:
                        parts.append(f"{label} ×{values[key] / medians[reference][key]:.2f}")
            lines.append(f"  {mode}: " + ", ".join(parts))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
