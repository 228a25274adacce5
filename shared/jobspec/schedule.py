"""The schedule: run_glue_no_trainer.py's arithmetic of optimizer steps, epochs and warmup.

Torch-free, so that the training loop (worker/training/loop.py, on the batches `accelerator.prepare`
left each process) and the dry run's plan (service/dry_run/plan.py, on the batches it expects each process
to get) compute it with the same code: the plan cannot drift from the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.jobspec.spec import JobSpec


@dataclass(frozen=True)
class Schedule:
    """The script's arithmetic, in optimizer updates of one process."""

    steps_per_epoch: int
    max_train_steps: int
    num_epochs: int
    warmup_steps: int


def plan_schedule(
    batches_per_epoch: int,
    *,
    accumulation: int,
    max_train_steps: int | None,
    num_train_epochs: float,
    num_warmup_steps: int,
    warmup_ratio: float,
) -> Schedule:
    """A fractional num_train_epochs counts as Trainer counts it: ceil(epochs × steps per epoch)
    optimizer steps, so 2.5 epochs of 10 steps train 25 steps, the third epoch cut short at its half
    (evaluated and saved there, as any last epoch that max_train_steps cuts short)."""
    steps_per_epoch = math.ceil(batches_per_epoch / accumulation)
    total = max_train_steps or math.ceil(num_train_epochs * steps_per_epoch)
    return Schedule(
        steps_per_epoch=steps_per_epoch,
        max_train_steps=total,
        num_epochs=math.ceil(total / steps_per_epoch),
        warmup_steps=num_warmup_steps or math.ceil(warmup_ratio * total),
    )


def spec_schedule(spec: JobSpec, batches_per_epoch: int) -> Schedule:
    """The schedule of `spec` when each process gets `batches_per_epoch` batches an epoch."""
    return plan_schedule(
        batches_per_epoch,
        accumulation=spec.gradient_accumulation_steps,
        max_train_steps=spec.max_train_steps,
        num_train_epochs=spec.num_train_epochs,
        num_warmup_steps=spec.num_warmup_steps,
        warmup_ratio=spec.warmup_ratio,
    )
