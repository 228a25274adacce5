"""The nine GLUE tasks: their text columns, labels and metrics. Pure data, no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class GlueTask:
    name: str
    text_keys: tuple[str, str | None]
    # Label names in the id order of the Hub's nyu-mll/glue dataset; None for regression (STS-B).
    label_names: tuple[str, ...] | None
    metrics: tuple[str, ...]
    main_metric: str
    # Evaluation splits: the Hub split name for each gluejobs split ("eval", "eval_mismatched").
    eval_splits: tuple[tuple[str, str], ...] = (("eval", "validation"),)

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def metric_names(self) -> tuple[str, ...]:
        """What an evaluation reports: the GLUE metric's names plus combined_score where there are two."""
        return (*self.metrics, "combined_score") if len(self.metrics) > 1 else self.metrics


_ENTAILMENT = ("entailment", "not_entailment")

TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask(
            "cola",
            ("sentence", None),
            ("unacceptable", "acceptable"),
            ("matthews_correlation",),
            "matthews_correlation",
        ),
        GlueTask("sst2", ("sentence", None), ("negative", "positive"), ("accuracy",), "accuracy"),
        GlueTask(
            "mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("accuracy", "f1"), "f1"
        ),
        GlueTask("stsb", ("sentence1", "sentence2"), None, ("pearson", "spearmanr"), "pearson"),
        GlueTask("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("accuracy", "f1"), "f1"),
        GlueTask(
            "mnli",
            ("premise", "hypothesis"),
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            "accuracy",
            eval_splits=(("eval", "validation_matched"), ("eval_mismatched", "validation_mismatched")),
        ),
        GlueTask("qnli", ("question", "sentence"), _ENTAILMENT, ("accuracy",), "accuracy"),
        GlueTask("rte", ("sentence1", "sentence2"), _ENTAILMENT, ("accuracy",), "accuracy"),
        GlueTask(
            "wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment"), ("accuracy",), "accuracy"
        ),
    )
}


@dataclass(frozen=True)
class GlueSubmission:
    """What GLUE's site expects from a task: one file per test split, and how predictions are written."""

    # (the Hub's test split name, the file GLUE expects for it)
    files: tuple[tuple[str, str], ...]
    # "id": the label id (0/1); "name": the label's name (entailment …); "score": STS-B's 0..5 score.
    label_format: Literal["id", "name", "score"]


GLUE_SUBMISSIONS: dict[str, GlueSubmission] = {
    "cola": GlueSubmission((("test", "CoLA.tsv"),), "id"),
    "sst2": GlueSubmission((("test", "SST-2.tsv"),), "id"),
    "mrpc": GlueSubmission((("test", "MRPC.tsv"),), "id"),
    "stsb": GlueSubmission((("test", "STS-B.tsv"),), "score"),
    "qqp": GlueSubmission((("test", "QQP.tsv"),), "id"),
    "mnli": GlueSubmission((("test_matched", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv")), "name"),
    "qnli": GlueSubmission((("test", "QNLI.tsv"),), "name"),
    "rte": GlueSubmission((("test", "RTE.tsv"),), "name"),
    "wnli": GlueSubmission((("test", "WNLI.tsv"),), "id"),
}
# GLUE's diagnostic set, predicted by an MNLI model (MNLI's label names), when the data has it.
DIAGNOSTIC_SUBMISSION_FILE = "AX.tsv"
SUBMISSION_HEADER = ("index", "prediction")

# What a job on its own files reports: accuracy for labels, Pearson/Spearman for scores.
FILE_CLASSIFICATION_METRICS = ("accuracy",)
FILE_REGRESSION_METRICS = ("pearson", "spearmanr", "combined_score")
FILE_METRICS = FILE_CLASSIFICATION_METRICS + FILE_REGRESSION_METRICS
LOSS_METRIC = "loss"

# Splits of the metric rows (contract).
TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"
EVAL_MISMATCHED_SPLIT = "eval_mismatched"


def greater_is_better(metric: str) -> bool:
    """Every GLUE metric grows with quality; a loss shrinks (Trainer's rule)."""
    return not metric.endswith("loss")
