"""Where a run's progress goes: the Reporter a run writes to (the runner's writes the database), the
filter that lets only the main process report (one row per event, not one per GPU), and what a run
says about its model and schedule before it trains."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from accelerate import Accelerator

from shared.jobspec.schedule import Schedule
from shared.jobspec.spec import JobSpec
from worker.training import tracking
from worker.training.modeling import head_in_fp32, parameter_counts

logger = logging.getLogger("worker.training.loop")


class Reporter(Protocol):
    """Where a run's progress goes. The runner's writes it to the database as it happens."""

    def log(self, message: str, *, level: str = "info", data: dict[str, Any] | None = None) -> None: ...

    def metrics(
        self, *, step: int, epoch: float, split: str, values: dict[str, float], best_metric: str | None = None
    ) -> None:
        """`best_metric` names the value among `values` that ranks evaluations (eval split only)."""

    def checkpoint(
        self, *, step: int, epoch: float, path: str, metrics: dict[str, float], is_best: bool
    ) -> None: ...

    def checkpoints_deleted(self, steps: list[int]) -> None: ...


class MainProcessReporter:
    """Forwards to the real reporter, and metric rows to the experiment trackers, on the main process
    only (one row per event, not one per GPU)."""

    def __init__(self, reporter: Reporter, accelerator: Accelerator) -> None:
        self._reporter = reporter
        self._accelerator = accelerator
        self._is_main = accelerator.is_main_process

    def log(self, message: str, *, level: str = "info", data: dict[str, Any] | None = None) -> None:
        logger.info(message)
        if self._is_main:
            self._reporter.log(message, level=level, data=data)

    def metrics(
        self, *, step: int, epoch: float, split: str, values: dict[str, float], best_metric: str | None = None
    ) -> None:
        if self._is_main:
            self._reporter.metrics(
                step=step, epoch=epoch, split=split, values=values, best_metric=best_metric
            )
            if self._accelerator.trackers:
                self._accelerator.log(tracking.tracker_values(split, values), step=step)

    def checkpoint(
        self, *, step: int, epoch: float, path: str, metrics: dict[str, float], is_best: bool
    ) -> None:
        if self._is_main:
            self._reporter.checkpoint(step=step, epoch=epoch, path=path, metrics=metrics, is_best=is_best)

    def checkpoints_deleted(self, steps: list[int]) -> None:
        if self._is_main:
            self._reporter.checkpoints_deleted(steps)


def log_model(model: Any, accelerator: Accelerator, report: MainProcessReporter) -> dict[str, Any]:
    """Say what runs in fp32 under autocast, and how many parameters train; the parameter counts."""
    if accelerator.mixed_precision != "no":
        in_fp32 = head_in_fp32(model)
        report.log(
            f"{accelerator.mixed_precision} autocast; in fp32: {', '.join(in_fp32)}, the loss, the "
            "weights and the optimizer's state",
            data={"fp32_modules": in_fp32},
        )
    counts = parameter_counts(model)
    report.log(
        f"parameters: {counts['trainable_params']:,} trainable of {counts['total_params']:,} "
        f"({counts['trainable_percent']}%)",
        data=counts,
    )
    return counts


def log_schedule(
    spec: JobSpec, schedule: Schedule, accelerator: Accelerator, report: MainProcessReporter
) -> None:
    report.log(
        f"training: {schedule.num_epochs} epochs, {schedule.max_train_steps} optimizer steps, "
        f"batch {spec.per_device_train_batch_size} × {accelerator.num_processes} processes × "
        f"{spec.gradient_accumulation_steps} accumulation, on {accelerator.device}, "
        f"mixed precision {accelerator.mixed_precision}",
        data={
            "num_epochs": schedule.num_epochs,
            "max_train_steps": schedule.max_train_steps,
            "warmup_steps": schedule.warmup_steps,
        },
    )
