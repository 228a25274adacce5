"""The leaderboard: finished jobs and sweeps on a GLUE task, ranked by the task's main metric.

A job counts with its value at its best evaluation (the checkpoint metric_for_best_model keeps); a
sweep with its winning configuration's median over seeds of the same (shared/research/sweep_stats.py).
A sweep's jobs appear only through their sweep, and reruns (checks of another entry) not at all; nor
do evaluation and prediction jobs (do_train false), nor sweeps of them: they train nothing.
Each entry sits next to the majority-class baseline of the rows it evaluated on and is flagged
near_chance within a point of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from service.research.baselines import Baseline, near_chance
from shared.core.tables import Job, JobStatus, Sweep
from shared.jobspec.spec import job_kind
from shared.jobspec.tasks import EVAL_SPLIT, TASKS, greater_is_better

HYPERPARAMETERS = (
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_train_steps",
    "lr_scheduler_type",
    "num_warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "max_length",
    "max_train_samples",
    "max_eval_samples",
    "seed",
)
LORA_HYPERPARAMETERS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
DEFAULT_RECIPE = "no_trainer"

BaselineOf = Callable[[dict[str, Any]], Baseline | None]


def build_leaderboard(
    jobs: Sequence[Job],
    sweeps: Sequence[tuple[Sweep, Sequence[Job], dict[str, Any]]],
    *,
    baseline_of: BaselineOf,
    task_baseline: Callable[[str], Baseline | None],
    only_task: str | None = None,
) -> list[dict[str, Any]]:
    """One board per task (GLUE's order): its dev-set baseline and its entries, ranked.

    `sweeps` holds each sweep with its jobs and sweep_stats.sweep_results; `baseline_of` gives the
    baseline of a spec's evaluation rows.
    """
    boards: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        entry = _job_entry(job, baseline_of)
        if entry is not None:
            boards.setdefault(job.spec["task_name"], []).append(entry)
    for sweep, members, results in sweeps:
        entry = _sweep_entry(sweep, members, results, baseline_of)
        if entry is not None:
            boards.setdefault(sweep.spec["task_name"], []).append(entry)
    tasks = [only_task] if only_task else [name for name in TASKS if name in boards]
    result = []
    for task in tasks:
        metric = TASKS[task].main_metric
        sign = -1 if greater_is_better(metric) else 1
        entries = sorted(boards.get(task, []), key=lambda e: (sign * e["value"], e["kind"], e["id"]))
        for rank, entry in enumerate(entries, start=1):
            entry["rank"] = rank
        baseline = task_baseline(task)
        result.append(
            {
                "task": task,
                "metric": metric,
                "baseline": asdict(baseline) if baseline else None,
                "entries": entries,
            }
        )
    return result


def is_ranked_job(job: Job) -> bool:
    """A job that stands on its own on the leaderboard (not a sweep's, not a rerun) as a training run: an
    evaluation or prediction job (do_train false) trained nothing, and its metrics are its model's,
    which the job that trained it (or the model's upload) already stands for."""
    return job.sweep_id is None and job.rerun_of is None and job_kind(job.spec or {}) == "train"


def _job_entry(job: Job, baseline_of: BaselineOf) -> dict[str, Any] | None:
    task = job.spec.get("task_name")
    if job.status != JobStatus.succeeded or task not in TASKS or not is_ranked_job(job):
        return None
    metric = TASKS[task].main_metric
    value = ((job.best_metrics or {}).get("metrics") or {}).get(metric)
    if value is None:
        return None
    final = (job.latest_metrics or {}).get(EVAL_SPLIT, {}).get(metric)
    return _entry(
        "job", job.id, job.spec, value, final, None, 1, [job.id], _trainable(job), None, baseline_of(job.spec)
    )


def _sweep_entry(
    sweep: Sweep, members: Sequence[Job], results: dict[str, Any], baseline_of: BaselineOf
) -> dict[str, Any] | None:
    winner = results.get("winner")
    if winner is None or sweep.spec.get("task_name") not in TASKS:
        return None
    if any(job_kind(job.spec or {}) != "train" for job in members[:1]):
        return None  # a sweep of evaluations (models compared on rows) trains nothing to rank
    chosen = next(c for c in results["configurations"] if c["configuration"] == winner["configuration"])
    metric = winner["metric"]
    final = chosen["final"].get(EVAL_SPLIT, {}).get(metric, {}).get("median")
    winners = [job for job in members if job.id in winner["job_ids"]]
    spec = winners[0].spec
    trainable = next((t for job in winners if (t := _trainable(job)) is not None), None)
    hyperparameters_spec = {k: v for k, v in spec.items() if k != "seed"}
    return _entry(
        "sweep",
        sweep.id,
        hyperparameters_spec,
        winner["median"],
        final,
        winner["std"],
        winner["seeds_evaluated"],
        winner["job_ids"],
        trainable,
        winner["configuration"],
        baseline_of(spec),
    )


def _entry(
    kind: str,
    entry_id: int,
    spec: dict[str, Any],
    value: float,
    final: float | None,
    std: float | None,
    seeds: int,
    job_ids: list[int],
    trainable: int | None,
    configuration: dict[str, Any] | None,
    baseline: Baseline | None,
) -> dict[str, Any]:
    names = HYPERPARAMETERS + (LORA_HYPERPARAMETERS if spec.get("apply_lora") else ())
    return {
        "rank": 0,
        "kind": kind,
        "id": entry_id,
        "value": value,
        "final_value": final,
        "std": std,
        "seeds": seeds,
        "model": spec.get("model_name_or_path"),
        "recipe": str(spec.get("recipe") or DEFAULT_RECIPE) + ("+lora" if spec.get("apply_lora") else ""),
        "hyperparameters": {name: spec[name] for name in names if spec.get(name) is not None},
        "trainable_params": trainable,
        "configuration": configuration,
        "job_ids": job_ids,
        "baseline": asdict(baseline) if baseline else None,
        "near_chance": near_chance(value, baseline),
    }


def _trainable(job: Job) -> int | None:
    value = (job.result or {}).get("trainable_params")
    return int(value) if value is not None else None
