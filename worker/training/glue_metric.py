"""A job's evaluation metrics, computed through `evaluate` with the GLUE metric shipped in the package.

The seeds call `evaluate.load("glue", task)`, which downloads the metric's script from the Hugging
Face Hub; a production cluster often cannot reach it. worker/training/metrics/glue is that metric as a local
evaluate module, loaded from its folder (no network). What a job reports is decided by
shared/jobspec/metric_rules.py: the GLUE metric's values for the task (or for the shape of one's own data),
`combined_score` as their mean where there are two (run_glue.py's rule), and `mse` for scores.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import mean_squared_error

from shared.jobspec.metric_rules import COMBINED_SCORE, MSE, MetricPlan

GLUE_MODULE = Path(__file__).resolve().parent / "metrics" / "glue"

Metrics = dict[str, float]


def compute_plan(plan: MetricPlan, preds: np.ndarray, refs: np.ndarray) -> Metrics:
    """The plan's metrics (shared.jobspec.metric_rules.metric_plan: a task's, or those of a job on its own
    files), as plain floats. `preds` are class ids (the argmax of the logits) for classification
    and scores for regression; a regression model's (n, 1) output may be passed as it is."""
    preds, refs = _as_pair(preds, refs)
    scored = glue_module(plan.glue_config).compute(predictions=preds, references=refs)
    metrics = {name: float(scored[name]) for name in plan.glue_names}
    if len(metrics) > 1:
        metrics[COMBINED_SCORE] = float(np.mean(list(metrics.values())))
    if MSE in plan.extra:
        metrics[MSE] = _mse(preds.astype(np.float64), refs.astype(np.float64))
    return metrics


def _mse(preds: np.ndarray, refs: np.ndarray) -> float:
    if not np.isfinite(preds).all():
        # A diverged model: worse than any finite error, and still a number that JSON rows and the
        # best-checkpoint comparison can hold (NaN and infinity cannot).
        return sys.float_info.max
    return float(mean_squared_error(refs, preds))


@cache
def glue_module(config_name: str) -> Any:
    """The local GLUE evaluate module for one configuration, loaded once per process."""
    import evaluate  # its import pulls in transformers' pipelines: only when a job evaluates

    # keep_in_memory: predictions are scored from memory, not through a cache file under ~/.cache.
    return evaluate.load(str(GLUE_MODULE), config_name=config_name, keep_in_memory=True)


def _as_pair(predictions: np.ndarray, references: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    preds = _one_dimensional(np.asarray(predictions), "predictions")
    refs = _one_dimensional(np.asarray(references), "references")
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} references")
    if len(preds) == 0:
        raise ValueError("no predictions to score")
    return preds, refs


def _one_dimensional(values: np.ndarray, name: str) -> np.ndarray:
    if values.ndim == 2 and values.shape[1] == 1:
        return values[:, 0]
    if values.ndim != 1:
        raise ValueError(f"{name} must be one value per example, got shape {values.shape}")
    return values
