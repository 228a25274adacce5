"""The nine GLUE tasks: their text columns, labels and evaluation splits. Pure data, no torch.

Which metrics a task reports and which one ranks it are metric rules: shared/jobspec/metric_rules.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.jobspec import metric_rules
from shared.jobspec.metric_rules import LOSS as LOSS_METRIC
from shared.jobspec.metric_rules import greater_is_better

__all__ = [
    "EVAL_MISMATCHED_SPLIT",
    "EVAL_SPLIT",
    "LOSS_METRIC",
    "TASKS",
    "TRAIN_SPLIT",
    "GlueTask",
    "greater_is_better",
]


@dataclass(frozen=True)
class GlueTask:
    name: str
    text_keys: tuple[str, str | None]
    # Label names in the id order of the Hub's nyu-mll/glue dataset; None for regression (STS-B).
    label_names: tuple[str, ...] | None
    # Evaluation splits: the Hub split name for each gluejobs split ("eval", "eval_mismatched").
    eval_splits: tuple[tuple[str, str], ...] = (("eval", "validation"),)

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def metrics(self) -> tuple[str, ...]:
        """What the GLUE metric returns for this task."""
        return metric_rules.task_plan(self.name).glue_names

    @property
    def main_metric(self) -> str:
        """The metric the GLUE leaderboard ranks this task by."""
        return metric_rules.task_plan(self.name).main


_ENTAILMENT = ("entailment", "not_entailment")

TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask(
            "cola",
            ("sentence", None),
            ("unacceptable", "acceptable"),
        ),
        GlueTask("sst2", ("sentence", None), ("negative", "positive")),
        GlueTask("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent")),
        GlueTask("stsb", ("sentence1", "sentence2"), None),
        GlueTask("qqp", ("question1", "question2"), ("not_duplicate", "duplicate")),
        GlueTask(
            "mnli",
            ("premise", "hypothesis"),
            ("entailment", "neutral", "contradiction"),
            eval_splits=(("eval", "validation_matched"), ("eval_mismatched", "validation_mismatched")),
        ),
        GlueTask("qnli", ("question", "sentence"), _ENTAILMENT),
        GlueTask("rte", ("sentence1", "sentence2"), _ENTAILMENT),
        GlueTask("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment")),
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

# Splits of the metric rows (contract).
TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"
EVAL_MISMATCHED_SPLIT = "eval_mismatched"
