"""The GLUE metric as a local `evaluate` module: `evaluate.load(<this folder>, config_name=task)`.

The seeds call `evaluate.load("glue", task)`, which fetches this metric's script from the Hugging
Face Hub; a cluster that cannot reach the Hub cannot evaluate. This module has the same
configurations, inputs and definitions (accuracy, binary F1, Matthews correlation, Pearson and
Spearman correlations, under the same names), shipped inside the package.

Two cases that the Hub's script leaves to scipy and scikit-learn are defined here instead, because
their values end up in JSON rows and in the comparison that picks the best checkpoint:
- F1 when nothing is predicted positive: 0.0 (scikit-learn's value too, minus its warning);
- a correlation that is undefined (constant or non-finite input, fewer than two pairs): 0.0, read as
  "no relation found", where scipy returns NaN and warns.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

_DESCRIPTION = """\
GLUE, the General Language Understanding Evaluation benchmark (https://gluebenchmark.com/), scores
each of its tasks with its own metric: accuracy, F1, Matthews correlation, or Pearson and Spearman
correlations.
"""

_CITATION = """\
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and
          Bowman, Samuel R.},
  booktitle={International Conference on Learning Representations},
  year={2019}
}
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: class ids (scores for stsb), one per example.
    references: the gold class ids (scores for stsb).
Returns, depending on the configuration:
    "accuracy", "f1" (mrpc, qqp), "matthews_correlation" (cola), "pearson" and "spearmanr" (stsb).
Example:
    >>> glue = evaluate.load("worker/training/metrics/glue", "mrpc")
    >>> glue.compute(predictions=[0, 1], references=[0, 1])
    {'accuracy': 1.0, 'f1': 1.0}
"""

ACCURACY_CONFIGS = ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli", "hans")
CONFIGS = ("cola", "stsb", "mrpc", "qqp", *ACCURACY_CONFIGS)


def simple_accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    return float((preds == labels).mean())


def acc_and_f1(preds: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    f1 = f1_score(y_true=labels, y_pred=preds, zero_division=0.0)
    return {"accuracy": simple_accuracy(preds, labels), "f1": float(f1)}


def matthews(preds: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    # scikit-learn already defines MCC as 0.0 when a whole row or column of the confusion matrix is empty.
    return {"matthews_correlation": float(matthews_corrcoef(labels, preds))}


def pearson_and_spearman(preds: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    preds, labels = preds.astype(np.float64), labels.astype(np.float64)
    return {
        "pearson": _correlation(pearsonr, preds, labels),
        "spearmanr": _correlation(spearmanr, preds, labels),
    }


def _correlation(statistic: Callable[..., Any], a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return 0.0
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    with warnings.catch_warnings():
        # Nearly constant input still has a defined correlation; scipy only warns that it may be imprecise.
        warnings.simplefilter("ignore", RuntimeWarning)
        value = float(statistic(a, b)[0])
    return value if math.isfinite(value) else 0.0


class Glue(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in CONFIGS:
            raise KeyError(
                f"unknown GLUE configuration {self.config_name!r}; expected one of {', '.join(CONFIGS)}"
            )
        kind = "float32" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value(kind), "references": datasets.Value(kind)}
            ),
            format="numpy",
        )

    def _compute(self, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
        if self.config_name == "cola":
            return matthews(predictions, references)
        if self.config_name == "stsb":
            return pearson_and_spearman(predictions, references)
        if self.config_name in ("mrpc", "qqp"):
            return acc_and_f1(predictions, references)
        return {"accuracy": simple_accuracy(predictions, references)}
