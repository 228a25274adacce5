"""Training runs in tests, DB-free: a reporter that records everything a run reports, the tiny spec
the training tests start from, and a run of it."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.core.config import Settings
from shared.jobspec.spec import JobSpec

TINY = "tiny-bert"


@dataclass
class RecordingReporter:
    """worker.training.loop's Reporter, keeping what it is told."""

    logs: list[str] = field(default_factory=list)
    log_data: list[dict[str, Any]] = field(default_factory=list)
    log_levels: list[str] = field(default_factory=list)
    rows: list[tuple[int, float, str, str, float]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)

    def log(self, message: str, *, level: str = "info", data: dict[str, Any] | None = None) -> None:
        self.logs.append(message)
        self.log_data.append(data or {})
        self.log_levels.append(level)

    def metrics(
        self, *, step: int, epoch: float, split: str, values: dict[str, float], best_metric: str | None = None
    ) -> None:
        self.rows += [(step, epoch, split, name, value) for name, value in values.items()]

    def checkpoint(
        self, *, step: int, epoch: float, path: str, metrics: dict[str, float], is_best: bool
    ) -> None:
        self.checkpoints.append(
            {"step": step, "epoch": epoch, "path": path, "metrics": metrics, "is_best": is_best}
        )

    def checkpoints_deleted(self, steps: list[int]) -> None:
        self.deleted += steps

    def values(self, split: str, name: str) -> list[tuple[int, float]]:
        return [(step, value) for step, _, s, n, value in self.rows if s == split and n == name]

    def series(self, split: str, name: str) -> list[float]:
        """The values alone, in the order they came."""
        return [value for _, value in self.values(split, name)]

    def steps(self, split: str) -> list[int]:
        """The steps `split` was reported at, in order (an evaluation's rows share one)."""
        return list(dict.fromkeys(step for step, _, s, _, _ in self.rows if s == split))


def make_spec(**changes: Any) -> JobSpec:
    values: dict[str, Any] = {
        "model_name_or_path": TINY,
        "task_name": "sst2",
        "max_train_samples": 64,
        "max_eval_samples": 32,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 16,
        "learning_rate": 1e-3,
        "num_train_epochs": 1,
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": 7,
    }
    values.update(changes)
    return JobSpec.model_validate(values)


def saving_spec(every: int, **changes: Any) -> JobSpec:
    """make_spec's run on 32 rows, a checkpoint every `every` steps, no evaluation: one to resume."""
    return make_spec(
        save_strategy="steps", save_steps=every, eval_strategy="no", max_train_samples=32, **changes
    )


def train(
    spec: JobSpec, settings: Settings, tmp_path: Path, *, name: str = "run", resume_from: Path | None = None
) -> tuple[RecordingReporter, dict[str, Any], Path]:
    from worker.training.loop import run_training

    reporter = RecordingReporter()
    output_dir = tmp_path / name
    result = run_training(spec, settings, output_dir=output_dir, reporter=reporter, resume_from=resume_from)
    return reporter, result, output_dir


def resume(
    spec: JobSpec, settings: Settings, tmp_path: Path, checkpoints: Path, step: int, *, name: str = "resumed"
) -> tuple[RecordingReporter, dict[str, Any], Path]:
    """`spec` run again from its checkpoint at `step` (in the folder `checkpoints`)."""
    from worker.training.checkpoints import checkpoint_path

    return train(spec, settings, tmp_path, name=name, resume_from=checkpoint_path(checkpoints, step))


def reset_accelerate_state() -> None:
    """Accelerate keeps one state per process (a job's child runs one job); a test process runs many."""
    if "accelerate.state" not in sys.modules:
        return  # nothing trained here
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
