"""Which metrics a job reports, which one ranks its evaluations, and which way is better. Torch-free.

The one home of these rules. The API checks `metric_for_best_model` with them before a job is
stored, the worker's GLUE metric computes what they name, and the training loop, the database's
best-metric bookkeeping and early stopping rank evaluations with them.

A GLUE task reports what the GLUE metric returns for its configuration, plus `combined_score`
(their mean) where there are two, as run_glue.py adds it. A job on its own files reports what the
Trainer page expects of such data: accuracy for labels, accuracy and F1 (MRPC's metrics) for two
classes, and for scores the STS-B metrics plus `mse` (run_glue.py's metric for scores of one's own).
"""

from __future__ import annotations

from dataclasses import dataclass

LOSS = "loss"
COMBINED_SCORE = "combined_score"
MSE = "mse"

# What the GLUE metric (evaluate's `glue`) returns for each configuration, in its order.
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    **{
        name: ("accuracy",)
        for name in ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli", "hans")
    },
}
# The metric each task is ranked by on the GLUE leaderboard; accuracy where not named here.
_MAIN_METRIC = {"cola": "matthews_correlation", "mrpc": "f1", "qqp": "f1", "stsb": "pearson"}
# Metrics for which a smaller value is better; every GLUE metric grows with quality.
_SMALLER_IS_BETTER = frozenset({LOSS, MSE})


@dataclass(frozen=True)
class MetricPlan:
    """What one evaluation of a job reports, and the metric that ranks evaluations by default."""

    glue_config: str  # the GLUE metric configuration that computes the GLUE part
    main: str
    extra: tuple[str, ...] = ()  # computed beside the GLUE metric (mse)

    @property
    def glue_names(self) -> tuple[str, ...]:
        return GLUE_METRICS[self.glue_config]

    @property
    def names(self) -> tuple[str, ...]:
        """Every metric an evaluation reports besides the loss, in the order they are reported."""
        combined = (COMBINED_SCORE,) if len(self.glue_names) > 1 else ()
        return (*self.glue_names, *combined, *self.extra)


def task_plan(task_name: str) -> MetricPlan:
    if task_name not in GLUE_METRICS:
        raise ValueError(f"unknown GLUE task {task_name!r}")
    return MetricPlan(task_name, _MAIN_METRIC.get(task_name, "accuracy"))


def own_files_plan(*, is_regression: bool, num_labels: int) -> MetricPlan:
    """A job on its own files: what its data allows. Accuracy ranks labels by default (as before
    F1 was reported; metric_for_best_model picks F1), Pearson ranks scores (as for STS-B)."""
    if is_regression:
        return MetricPlan("stsb", "pearson", extra=(MSE,))
    if num_labels == 2:
        return MetricPlan("mrpc", "accuracy")  # MRPC's configuration: accuracy and binary F1
    return MetricPlan("sst2", "accuracy")  # accuracy alone, whatever the number of classes


def metric_plan(task_name: str | None, *, is_regression: bool, num_labels: int) -> MetricPlan:
    if task_name is not None:
        return task_plan(task_name)
    return own_files_plan(is_regression=is_regression, num_labels=num_labels)


def possible_metrics(task_name: str | None) -> tuple[str, ...]:
    """What a job may report before its data is read (the API's view), the loss included."""
    if task_name is not None:
        return (*task_plan(task_name).names, LOSS)
    names: dict[str, None] = {}
    for is_regression, num_labels in ((False, 2), (False, 3), (True, 1)):
        names |= dict.fromkeys(own_files_plan(is_regression=is_regression, num_labels=num_labels).names)
    return (*names, LOSS)


def ranking_metric(plan: MetricPlan, requested: str | None) -> str:
    """The metric that ranks evaluations: `requested` (metric_for_best_model) when the job reports
    it, else the plan's main metric. Trainer's `eval_` prefix is accepted and dropped."""
    if requested is None:
        return plan.main
    name = requested.removeprefix("eval_")
    reported = (*plan.names, LOSS)
    if name not in reported:
        raise ValueError(
            f"metric_for_best_model {requested!r} is not reported by this job; "
            f"it reports {', '.join(reported)}"
        )
    return name


def greater_is_better(metric: str, given: bool | None = None) -> bool:
    """Whether a larger `metric` is better: the job's `greater_is_better` when it gives one (Trainer's
    option, honoured as given), else Trainer's rule (a loss shrinks), and mse shrinks too."""
    if given is not None:
        return given
    return not (metric in _SMALLER_IS_BETTER or metric.endswith("_loss"))


def improves(
    value: float,
    best: float | None,
    metric: str,
    *,
    threshold: float = 0.0,
    greater: bool | None = None,
) -> bool:
    """Whether `value` beats `best` by more than `threshold` (EarlyStoppingCallback's test; with
    threshold 0, plain "better", which is how the best checkpoint is chosen). `greater`: the job's
    greater_is_better."""
    if best is None:
        return True
    better = value > best if greater_is_better(metric, greater) else value < best
    return better and abs(value - best) > threshold
