"""The majority-class baseline of a job's evaluation rows: what always answering the commonest label
scores on the task's main metric. A result within a point of it has learnt nothing (WNLI's famous
trap; small RTE runs too).

The rows are those the job evaluated on: its validation_file, else the task's dev split from
GLUEJOBS_GLUE_DIR, cut to max_eval_samples. Read with shared/data/reading.py's rule and cached per
data version (the files' path, size and mtime), so a leaderboard reads each dev file once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shared.core.config import Settings
from shared.core.errors import InvalidSpec
from shared.data.reading import DataError, job_data_files, read_job_data
from shared.jobspec.spec import JobSpec
from shared.jobspec.tasks import EVAL_SPLIT, TASKS

# numpy is imported where used: the API imports this module at start and computes a baseline only on
# a leaderboard's request, so that its start does not pay for numpy's import.
if TYPE_CHECKING:
    import numpy as np

# One GLUE point: GLUE reports metrics ×100, gluejobs in 0..1.
NEAR_CHANCE_MARGIN = 0.01
_EVAL_SOURCES = ("validation_file", EVAL_SPLIT)


@dataclass(frozen=True)
class Baseline:
    metric: str
    value: float
    majority_label: str | None
    share: float | None
    rows: int
    where: str


def near_chance(value: float, baseline: Baseline | None) -> bool | None:
    """Less than one point above the baseline (or below it: no better than chance either)."""
    if baseline is None:
        return None
    return value - baseline.value < NEAR_CHANCE_MARGIN


def majority_baseline(spec: JobSpec, settings: Settings) -> Baseline | None:
    """None when the rows cannot be read here (the Hub's, or a file that is gone)."""
    if spec.task_name is None:
        return None
    evaluating = spec.model_copy(update={"eval_strategy": "epoch", "do_predict": False})
    try:
        key = _key(evaluating, settings)
    except (DataError, InvalidSpec):
        return None
    with _lock:
        if key in _cache:
            return _cache[key]
    try:
        data = read_job_data(evaluating, settings, train=False)
    except (DataError, InvalidSpec):
        return None
    rows = data.evals.get(EVAL_SPLIT)
    baseline = (
        None
        if rows is None or rows.labels is None
        else _baseline(spec.task_name, rows.labels, rows.table.where)
    )
    with _lock:
        _cache[key] = baseline
    return baseline


def _baseline(task_name: str, labels: np.ndarray, where: str) -> Baseline:
    import numpy as np

    task = TASKS[task_name]
    metric = task.main_metric
    if task.label_names is None:
        # A constant prediction has no correlation with the scores.
        return Baseline(metric, 0.0, None, None, len(labels), where)
    counts = np.bincount(labels.astype(np.int64), minlength=task.num_labels)
    majority = int(np.argmax(counts))  # on a tie, the lower label id
    share = float(counts[majority] / len(labels))
    return Baseline(
        metric,
        _constant_score(metric, majority, share),
        task.label_names[majority],
        share,
        len(labels),
        where,
    )


def _constant_score(metric: str, majority: int, share: float) -> float:
    if metric == "accuracy":
        return share
    if metric == "f1":  # F1 of the positive class (id 1): precision = its share, recall = 1
        return 2 * share / (1 + share) if majority == 1 else 0.0
    return 0.0  # Matthews correlation (CoLA) of a constant prediction


def _key(spec: JobSpec, settings: Settings) -> tuple[object, ...]:
    versions = []
    for role, source in sorted(job_data_files(spec, settings).items(), key=lambda item: item[0]):
        if role in _EVAL_SOURCES and isinstance(source, Path):
            stat = source.stat() if source.exists() else None
            versions.append(
                (role, str(source), stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)
            )
    # The mapped label column decides which labels the baseline counts.
    return (spec.task_name, spec.max_eval_samples, tuple(versions), spec.label_column)


_lock = threading.Lock()
_cache: dict[tuple[object, ...], Baseline | None] = {}
