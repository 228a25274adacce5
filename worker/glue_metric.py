"""GLUE metrics that work offline.

`evaluate.load("glue")` downloads its script from the Hugging Face Hub, which a production cluster
often cannot reach. These are the same definitions under the same names (the GLUE metric's
`accuracy`, `f1`, `matthews_correlation`, `pearson`, `spearmanr`), plus `combined_score`, the mean
of the two where a task reports two (as run_glue.py adds it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from shared.tasks import TASKS

Metrics = dict[str, float]


def compute_metrics(
    task_name: str | None, predictions: np.ndarray, references: np.ndarray, *, is_regression: bool
) -> Metrics:
    """The GLUE metrics of `task_name` (or of a job on its own files when None), as plain floats.

    `predictions` are class ids (the argmax of the logits) for classification and scores for
    regression; a regression model's (n, 1) output may be passed as it is.
    """
    preds, refs = _as_pair(predictions, references)
    names = _metric_names(task_name, is_regression=is_regression)
    metrics = _SCORERS[names](preds, refs)
    if len(metrics) > 1:
        metrics["combined_score"] = float(np.mean(list(metrics.values())))
    return metrics


def _metric_names(task_name: str | None, *, is_regression: bool) -> tuple[str, ...]:
    if task_name is None:
        # A job on its own files: Pearson/Spearman for scores, accuracy for any number of classes.
        return ("pearson", "spearmanr") if is_regression else ("accuracy",)
    task = TASKS.get(task_name)
    if task is None:
        raise ValueError(f"unknown GLUE task {task_name!r}; expected one of {', '.join(TASKS)}")
    if task.is_regression != is_regression:
        kind = "a regression" if task.is_regression else "a classification"
        raise ValueError(f"{task_name} is {kind} task, but is_regression={is_regression} was passed")
    return task.metrics


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


def _accuracy(preds: np.ndarray, refs: np.ndarray) -> float:
    return float((preds == refs).mean())


def _f1(preds: np.ndarray, refs: np.ndarray) -> float:
    # zero_division=0.0 is the value the GLUE metric returns too, minus its UndefinedMetricWarning
    # (a tiny model that predicts only class 0 is common in tests and smoke runs).
    return float(f1_score(y_true=refs, y_pred=preds, zero_division=0.0))


def _matthews(preds: np.ndarray, refs: np.ndarray) -> float:
    # sklearn already defines MCC as 0.0 when a whole row or column of the confusion matrix is empty.
    return float(matthews_corrcoef(refs, preds))


def _pearson_and_spearman(preds: np.ndarray, refs: np.ndarray) -> Metrics:
    preds, refs = preds.astype(np.float64), refs.astype(np.float64)
    return {"pearson": _correlation(pearsonr, preds, refs), "spearmanr": _correlation(spearmanr, preds, refs)}


def _correlation(statistic: Callable[..., tuple[float, float]], a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's or Spearman's r, or 0.0 where it is undefined.

    A correlation is undefined (scipy returns NaN and warns) for constant input, which a tiny or
    freshly initialised model produces, for fewer than two pairs, and for non-finite values.
    NaN cannot be stored in JSON or compared when picking the best checkpoint, and "no linear
    relation found" is the honest reading of all these cases, so they score 0.0.
    """
    if len(a) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return 0.0
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    with warnings.catch_warnings():
        # Nearly constant input still has a defined correlation; scipy only warns that it may be imprecise.
        warnings.simplefilter("ignore", RuntimeWarning)
        value = float(statistic(a, b)[0])
    return value if math.isfinite(value) else 0.0


# The GLUE metric's definitions, by the metric names shared.tasks gives each task.
_SCORERS: dict[tuple[str, ...], Callable[[np.ndarray, np.ndarray], Metrics]] = {
    ("accuracy",): lambda preds, refs: {"accuracy": _accuracy(preds, refs)},
    ("accuracy", "f1"): lambda preds, refs: {"accuracy": _accuracy(preds, refs), "f1": _f1(preds, refs)},
    ("matthews_correlation",): lambda preds, refs: {"matthews_correlation": _matthews(preds, refs)},
    ("pearson", "spearmanr"): _pearson_and_spearman,
}
