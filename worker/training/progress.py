"""Where a run is, and what it has learnt: the counters Trainer keeps in its TrainerState (steps,
the best evaluation, early stopping's count), written into every checkpoint and read back on resume."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.jobspec.metric_rules import improves
from worker.training import checkpoints


@dataclass
class Progress:
    """Where the loop is, and what it has learnt: the counters Trainer keeps in its TrainerState."""

    steps_per_epoch: int
    ranking: str  # the metric that ranks evaluations
    greater: bool | None = None  # the spec's greater_is_better: which way `ranking` improves
    completed_steps: int = 0
    best_value: float | None = None
    best_step: int | None = None
    evaluations_without_improvement: int = 0
    last_eval_step: int | None = None
    last_save_step: int | None = None
    eval_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    stopped_early: bool = False

    @property
    def epoch(self) -> float:
        return round(self.completed_steps / self.steps_per_epoch, 4)

    def record_evaluation(self, metrics: dict[str, float], *, threshold: float) -> None:
        """Track the best evaluation and, as EarlyStoppingCallback does, the evaluations in a row that
        did not beat the best so far by more than `threshold`."""
        self.last_eval_step = self.completed_steps
        self.eval_metrics[self.completed_steps] = metrics
        value = metrics.get(self.ranking)
        if value is None:
            return
        if improves(value, self.best_value, self.ranking, threshold=threshold, greater=self.greater):
            self.evaluations_without_improvement = 0
        else:
            self.evaluations_without_improvement += 1
        if improves(value, self.best_value, self.ranking, greater=self.greater):
            self.best_value, self.best_step = value, self.completed_steps

    def state(self) -> checkpoints.TrainingState:
        return checkpoints.TrainingState(
            self.completed_steps,
            self.epoch,
            self.best_value,
            self.best_step,
            self.evaluations_without_improvement,
        )

    def restore(self, state: checkpoints.TrainingState) -> None:
        """Continue from a checkpoint's state (its step is saved already)."""
        self.completed_steps = state.completed_steps
        self.best_value, self.best_step = state.best_value, state.best_step
        self.evaluations_without_improvement = state.evaluations_without_improvement
        self.last_save_step = state.completed_steps
