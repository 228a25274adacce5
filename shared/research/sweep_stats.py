"""A sweep's results: per configuration, statistics over seeds of every evaluation metric.

Torch-free and DB-free: it takes the sweep, its jobs and their evaluation rows. For each succeeded
job it takes two evaluations: the best (the step the job's best_metrics names: the checkpoint
metric_for_best_model keeps) and the final one (the last evaluation step); every split (eval,
eval_mismatched) and every metric name at those steps. Over the seeds of a configuration it gives
median, mean, sample standard deviation (n−1; null for one seed), min and max. The winning
configuration has the best median of the task's main metric at the best evaluation.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

from shared.core.tables import Job, JobMetric, JobStatus, Sweep
from shared.jobspec.tasks import EVAL_SPLIT, TASKS, greater_is_better

POINTS = ("best", "final")
DEFAULT_METRIC = "accuracy"


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def evaluation_points(job: Job, rows: Sequence[JobMetric]) -> dict[str, dict[str, dict[str, float]]] | None:
    """The job's best and final evaluations: {"best"|"final": {split: {name: value}}}; None without any."""
    steps = sorted({r.step for r in rows if r.split == EVAL_SPLIT})
    if not steps:
        return None
    final = steps[-1]
    best = int((job.best_metrics or {}).get("step", final))

    def at(step: int) -> dict[str, dict[str, float]]:
        values: dict[str, dict[str, float]] = {}
        for row in rows:
            if row.step == step:
                values.setdefault(row.split, {})[row.name] = row.value
        return values

    return {"best": at(best), "final": at(final)}


def main_metric(spec: dict[str, Any], jobs: Sequence[Job]) -> str:
    """The metric a sweep is ranked by: the task's main metric, else the one its jobs rank by."""
    task = spec.get("task_name")
    if task in TASKS:
        return TASKS[task].main_metric
    if spec.get("metric_for_best_model"):
        return str(spec["metric_for_best_model"])
    for job in jobs:
        if job.best_metrics:
            return str(job.best_metrics["metric"])
    return DEFAULT_METRIC


def sweep_status(statuses: Sequence[JobStatus], *, cancel_requested: bool) -> str:
    """queued (nothing started), running, or once every job has ended: succeeded (all of them),
    cancelled (the sweep was cancelled), failed (a job failed), else cancelled (a job was)."""
    if all(s == JobStatus.queued for s in statuses):
        return "queued"
    if not all(s.is_terminal for s in statuses):
        return "running"
    if all(s == JobStatus.succeeded for s in statuses):
        return "succeeded"
    if cancel_requested:
        return "cancelled"
    return "failed" if JobStatus.failed in statuses else "cancelled"


def job_counts(jobs: Sequence[Job]) -> dict[str, int]:
    counts = {str(status): 0 for status in JobStatus}
    for job in jobs:
        counts[str(job.status)] += 1
    return counts


def configuration_of(job: Job, grid_keys: Sequence[str]) -> dict[str, Any]:
    return {key: job.spec.get(key) for key in grid_keys}


def sweep_results(sweep: Sweep, jobs: Sequence[Job], rows: Sequence[JobMetric]) -> dict[str, Any]:
    """Per configuration (in grid order): its jobs, seeds and statistics; the winner."""
    keys = list(sweep.grid)
    metric = main_metric(sweep.spec, jobs)
    rows_by_job: dict[int, list[JobMetric]] = {}
    for row in rows:
        rows_by_job.setdefault(row.job_id, []).append(row)
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(json.dumps(configuration_of(job, keys), sort_keys=True), []).append(job)

    configurations = []
    for members in groups.values():
        points = [
            p
            for job in members
            if job.status == JobStatus.succeeded
            and (p := evaluation_points(job, rows_by_job.get(job.id, []))) is not None
        ]
        configurations.append(
            {
                "configuration": configuration_of(members[0], keys),
                "job_ids": [job.id for job in members],
                "seeds": [job.spec.get("seed") for job in members],
                "job_counts": job_counts(members),
                "seeds_evaluated": len(points),
                **{point: _statistics([p[point] for p in points]) for point in POINTS},
            }
        )
    return {
        "main_metric": metric,
        "configurations": configurations,
        # The spec's greater_is_better speaks for its metric_for_best_model alone.
        "winner": _winner(
            configurations,
            metric,
            greater=sweep.spec.get("greater_is_better")
            if metric == sweep.spec.get("metric_for_best_model")
            else None,
        ),
    }


def _statistics(evaluations: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """{split: {name: summary over the evaluations that have it}}."""
    values: dict[str, dict[str, list[float]]] = {}
    for evaluation in evaluations:
        for split, metrics in evaluation.items():
            for name, value in metrics.items():
                values.setdefault(split, {}).setdefault(name, []).append(value)
    return {split: {name: summarize(v) for name, v in metrics.items()} for split, metrics in values.items()}


def _winner(
    configurations: list[dict[str, Any]], metric: str, *, greater: bool | None
) -> dict[str, Any] | None:
    scored = [
        (c["best"][EVAL_SPLIT][metric]["median"], index, c)
        for index, c in enumerate(configurations)
        if metric in c["best"].get(EVAL_SPLIT, {})
    ]
    if not scored:
        return None
    sign = 1 if greater_is_better(metric, greater) else -1
    # Best median first; on a tie, the configuration listed first (the grid's order).
    median, _, best = max(scored, key=lambda item: (sign * item[0], -item[1]))
    return {
        "configuration": best["configuration"],
        "metric": metric,
        "median": median,
        "std": best["best"][EVAL_SPLIT][metric]["std"],
        "seeds_evaluated": best["seeds_evaluated"],
        "job_ids": best["job_ids"],
    }
