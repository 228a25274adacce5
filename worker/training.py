"""The training loop: run_glue_no_trainer.py's behaviour (or Trainer's, under the trainer recipe)
with Accelerate, DB-free.

It reads like accelerate's nlp_example: Accelerator, seed, data, model, optimizer, scheduler,
`prepare`, then per epoch train → evaluate → log → save. Everything it learns goes to a `Reporter`
(the runner's, which writes the database) and to the job's experiment trackers; only the main
process reports.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow.compute
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import (
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    default_data_collator,
    get_scheduler,
)
from transformers.trainer_pt_utils import LengthGroupedSampler

from shared.artifact_links import artifact_path, download_command
from shared.config import Settings
from shared.errors import JobFailed
from shared.metric_rules import MetricPlan, improves, metric_plan, ranking_metric
from shared.schedule import Schedule, spec_schedule
from shared.spec import JobSpec
from shared.tasks import EVAL_SPLIT, TRAIN_SPLIT
from worker import checkpoints, throughput, tracking
from worker.checkpoint_uploads import CheckpointUploads, SavedCheckpoint
from worker.data import (
    RawData,
    TokenizedData,
    in_row_order,
    load_raw_data,
    longest_first,
    tokenize_data,
)
from worker.determinism import DETERMINISTIC_ENVIRONMENT, deterministic_kernels
from worker.glue_metric import compute_plan
from worker.job_storage import JobStorage
from worker.modeling import (
    apply_lora,
    head_in_fp32,
    load_model,
    load_model_files,
    load_tokenizer,
    make_optimizer,
    parameter_counts,
    resolve_model,
    save_model_files,
)
from worker.submission import write_glue_submission

logger = logging.getLogger(__name__)


class Preempted(Exception):
    """The run stopped on request (its worker is shutting down) after saving a checkpoint at `step`;
    the next attempt resumes from it, so at most the step in flight is lost."""

    def __init__(self, step: int, checkpoint: Path) -> None:
        super().__init__(f"stopped on request at step {step}; checkpoint {checkpoint.name} saved")
        self.step = step
        self.checkpoint = checkpoint


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


# ---------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------


def run_training(
    spec: JobSpec,
    settings: Settings,
    *,
    output_dir: Path,
    reporter: Reporter,
    resume_from: Path | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
    storage: JobStorage | None = None,
) -> dict[str, Any]:
    """Fine-tune spec's model on spec's task; returns the run's summary (the job's `result`).

    `stop_requested` is asked after every optimizer step; once it says yes (in any process), the
    run saves a checkpoint at that step and raises Preempted. `storage` is where checkpoints go
    before they are declared (worker/job_storage.py; default: `output_dir` alone).
    """
    storage = storage or JobStorage.local_only(output_dir)
    if spec.fp16 and not torch.cuda.is_available():
        raise JobFailed("fp16 needs a CUDA GPU and this worker has none; use bf16 (it also runs on CPU)")
    trackers = tracking.trackers_for(spec, output_dir)
    accelerator = Accelerator(
        # Several processes and no GPU: accelerate runs them on the CPU over gloo only when told so.
        cpu=int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available(),
        mixed_precision=spec.mixed_precision,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        # Each epoch's order follows from (seed, epoch), so a resumed run sees the same batches.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        log_with=trackers or None,
        project_config=tracking.project_configuration(output_dir),
    )
    if trackers:
        accelerator.init_trackers(
            tracking.PROJECT_NAME,
            config=tracking.tracker_config(spec),
            init_kwargs=tracking.init_kwargs(output_dir),
        )
    try:
        with deterministic_kernels(spec.use_deterministic_algorithms):
            return _train(spec, settings, accelerator, storage, reporter, resume_from, stop_requested)
    finally:
        if trackers:
            accelerator.end_training()


def _train(
    spec: JobSpec,
    settings: Settings,
    accelerator: Accelerator,
    storage: JobStorage,
    reporter: Reporter,
    resume_from: Path | None,
    stop_requested: Callable[[], bool],
) -> dict[str, Any]:
    """nlp_example's story: set up, then per epoch train → evaluate → save, then the outputs."""
    run = _set_up(spec, settings, accelerator, storage, _MainProcessReporter(reporter, accelerator))
    start_epoch, skip_batches = 0, 0
    if resume_from is not None:
        start_epoch, skip_batches = _resume(run, resume_from, spec.gradient_accumulation_steps)
    _log_schedule(run)
    intervals = _Intervals.of(spec)
    for epoch in range(start_epoch, run.schedule.num_epochs):
        loader = _epoch_batches(run, epoch, skip=skip_batches if epoch == start_epoch else 0)
        if _train_epoch(run, loader, intervals, stop_requested):
            break
    if spec.evaluates and run.progress.last_eval_step != run.progress.completed_steps:
        _evaluate_all(run)  # so that every run ends with the metrics of its final weights
    final_metrics = _final_model(run)
    _write_outputs(run)
    run.uploads.wait()  # the run ends once every checkpoint it saved is uploaded and declared
    return _summary(run, final_metrics)


# ---------------------------------------------------------------------------------------------------
# Set-up: seed, data, model, optimizer, `prepare`, schedule
# ---------------------------------------------------------------------------------------------------


def _set_up(
    spec: JobSpec,
    settings: Settings,
    accelerator: Accelerator,
    storage: JobStorage,
    report: _MainProcessReporter,
) -> _Run:
    """Everything the loop needs, prepared: the steps of nlp_example's `training_function` before
    its loop."""
    seed = _seed(spec, report)
    model_source = resolve_model(spec.model_name_or_path, settings, registered=spec.registered_model)
    tokenizer = load_tokenizer(model_source, use_slow_tokenizer=spec.use_slow_tokenizer)
    raw = load_raw_data(spec, settings)
    num_labels = 1 if raw.is_regression else len(raw.label_names or ())
    plan = metric_plan(spec.task_name, is_regression=raw.is_regression, num_labels=num_labels)
    ranking = _ranking_metric(plan, spec.metric_for_best_model)
    data = _tokenize(accelerator, raw, tokenizer, spec, settings.cache_dir, report)
    model = _build_model(model_source, spec, raw, num_labels)
    counts = _log_model(model, accelerator, report)

    train_dataloader, eval_dataloaders, length_sampler, eval_orders = _dataloaders(
        spec, seed, data, tokenizer, accelerator
    )
    optimizer = make_optimizer(
        model,
        spec.optim,
        learning_rate=spec.learning_rate,
        weight_decay=spec.weight_decay,
        betas=(spec.adam_beta1, spec.adam_beta2),
        eps=spec.adam_epsilon,
    )
    model, optimizer, train_dataloader, *prepared_evals = accelerator.prepare(
        model, optimizer, train_dataloader, *eval_dataloaders.values()
    )
    _keep_model_files_in_checkpoints(accelerator, tokenizer)

    # The schedule: the script's arithmetic, counted after `prepare` shards the batches.
    schedule = spec_schedule(spec, len(train_dataloader))
    # A prepared scheduler steps once per process per update, hence the factors (as in the script).
    lr_scheduler = accelerator.prepare(
        get_scheduler(
            name=spec.lr_scheduler_type,
            optimizer=optimizer,
            num_warmup_steps=schedule.warmup_steps * accelerator.num_processes,
            num_training_steps=schedule.max_train_steps * accelerator.num_processes,
        )
    )
    run = _Run(
        spec=spec,
        settings=settings,
        output_dir=storage.local,
        storage=storage,
        accelerator=accelerator,
        tokenizer=tokenizer,
        raw=raw,
        data=data,
        model=model,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        train_dataloader=train_dataloader,
        length_sampler=length_sampler,
        eval_dataloaders=dict(zip(eval_dataloaders, prepared_evals, strict=True)),
        eval_orders=eval_orders,
        plan=plan,
        schedule=schedule,
        parameter_counts=counts,
        report=report,
        progress=_Progress(
            steps_per_epoch=schedule.steps_per_epoch, ranking=ranking, greater=spec.greater_is_better
        ),
        meter=_Meter(accelerator),
    )
    run.uploads = CheckpointUploads(storage, lambda saved: _declare_checkpoint(run, saved))
    return run


def _seed(spec: JobSpec, report: _MainProcessReporter) -> int:
    assert spec.seed is not None, "the API records a seed on every job"
    set_seed(spec.seed)
    if spec.use_deterministic_algorithms:
        environment = {name: os.environ.get(name) for name in DETERMINISTIC_ENVIRONMENT}
        report.log(
            "deterministic algorithms on; "
            + ", ".join(f"{name}={value}" for name, value in environment.items()),
            data=environment,
        )
    return spec.seed


def _dataloaders(
    spec: JobSpec,
    seed: int,
    data: TokenizedData,
    tokenizer: PreTrainedTokenizerBase,
    accelerator: Accelerator,
) -> tuple[DataLoader, dict[str, DataLoader], LengthGroupedSampler | None, dict[str, np.ndarray | None]]:
    return make_dataloaders(
        data,
        tokenizer,
        pad_to_max_length=spec.pad_to_max_length,
        group_by_length=spec.group_by_length,
        shuffle_length_groups=spec.shuffle_length_groups,
        group_eval_by_length=spec.group_eval_by_length,
        train_batch_size=spec.per_device_train_batch_size,
        eval_batch_size=spec.per_device_eval_batch_size,
        seed=seed,
        pad_to_multiple_of=pad_multiple(accelerator),
    )


def _log_model(model: Any, accelerator: Accelerator, report: _MainProcessReporter) -> dict[str, Any]:
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


def _log_schedule(run: _Run) -> None:
    spec, schedule, accelerator = run.spec, run.schedule, run.accelerator
    run.report.log(
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


@dataclass
class _Run:
    """What the loop's steps share once everything is prepared (Trainer keeps the same on `self`)."""

    spec: JobSpec
    settings: Settings
    output_dir: Path
    storage: JobStorage
    accelerator: Accelerator
    tokenizer: PreTrainedTokenizerBase
    raw: RawData
    data: TokenizedData
    model: Any
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    train_dataloader: Any
    length_sampler: LengthGroupedSampler | None
    eval_dataloaders: dict[str, DataLoader]
    eval_orders: dict[str, np.ndarray | None]  # sorted evaluation: each split's rows, longest first
    plan: MetricPlan
    schedule: Schedule
    parameter_counts: dict[str, Any]
    report: _MainProcessReporter
    progress: _Progress
    meter: _Meter
    uploads: CheckpointUploads = field(init=False)

    @property
    def checkpoints_dir(self) -> Path:
        return self.output_dir / "checkpoints"


@dataclass(frozen=True)
class _Intervals:
    """When the loop logs, evaluates, saves, clips and stops early: the spec's values, nothing else."""

    logging_steps: int
    eval_strategy: str
    eval_steps: int | None
    save_strategy: str
    save_steps: int | None
    save_total_limit: int | None
    max_grad_norm: float | None
    early_stopping_patience: int | None
    early_stopping_threshold: float

    @classmethod
    def of(cls, spec: JobSpec) -> _Intervals:
        return cls(
            logging_steps=spec.logging_steps,
            eval_strategy=spec.eval_strategy,
            eval_steps=spec.eval_steps,
            save_strategy=spec.save_strategy,
            save_steps=spec.save_steps,
            save_total_limit=spec.save_total_limit,
            max_grad_norm=spec.max_grad_norm or None,  # Trainer: 0 means no clipping too
            early_stopping_patience=spec.early_stopping_patience,
            early_stopping_threshold=spec.early_stopping_threshold,
        )

    def evaluates_at(self, step: int) -> bool:
        return self.eval_strategy == "steps" and bool(self.eval_steps) and step % (self.eval_steps or 1) == 0

    def saves_at(self, step: int) -> bool:
        return self.save_strategy == "steps" and bool(self.save_steps) and step % (self.save_steps or 1) == 0


@dataclass
class _Progress:
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


class _Meter:
    """What the training cost: samples, tokens and seconds, counted beside the loop (Trainer's
    speed metrics, plus what worker/throughput.py needs for MFU). Evaluation and saving are paused
    out of the training time."""

    def __init__(self, accelerator: Accelerator) -> None:
        self._accelerator = accelerator
        self._processes = accelerator.num_processes
        self.train_seconds = 0.0
        # This process's CPU time (all its threads) over the same span: what the training cost the
        # machine, which other work on shared cores does not inflate the way it inflates wall time.
        self.train_cpu_seconds = 0.0
        self.eval_seconds = 0.0
        self.train_samples = 0
        self.padded_tokens = 0
        self.real_tokens = 0
        # Sums of each sequence's squared length (padded, real): attention's FLOPs (worker/throughput.py).
        self.padded_squared = 0
        self.real_squared = 0
        # Summed on the device during an epoch: no host sync per step (read once, after the epoch).
        self._real_tokens = torch.zeros((), dtype=torch.long, device=accelerator.device)
        self._real_squared = torch.zeros((), dtype=torch.long, device=accelerator.device)
        self._started = self._started_cpu = 0.0

    @contextmanager
    def training(self) -> Iterator[None]:
        """One epoch's training: its time, and its real tokens gathered from every process once it
        ends (a collective: it runs only when every process finishes the epoch normally)."""
        self._real_tokens.zero_()
        self._real_squared.zero_()
        self._started, self._started_cpu = time.perf_counter(), time.process_time()
        yield
        self.train_seconds += time.perf_counter() - self._started
        self.train_cpu_seconds += time.process_time() - self._started_cpu
        self.real_tokens += int(self._accelerator.reduce(self._real_tokens, reduction="sum").item())
        self.real_squared += int(self._accelerator.reduce(self._real_squared, reduction="sum").item())

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent in here (evaluating, saving) is not training time."""
        paused, paused_cpu = time.perf_counter(), time.process_time()
        yield
        self._started += time.perf_counter() - paused
        self._started_cpu += time.process_time() - paused_cpu

    def count(self, batch: dict[str, torch.Tensor]) -> None:
        """A training batch of this process (every process trains on a batch of the same shape)."""
        rows, width = batch["input_ids"].shape
        self.train_samples += rows * self._processes
        self.padded_tokens += rows * width * self._processes
        self.padded_squared += rows * width * width * self._processes
        lengths = batch["attention_mask"].sum(dim=1)
        self._real_tokens += lengths.sum()
        self._real_squared += (lengths * lengths).sum()

    def summary(self, model: Any, peak_flops: float | None) -> dict[str, Any]:
        """The run's speed figures (for the job's `result`)."""
        accelerator = self._accelerator
        peak, peak_source = throughput.peak_flops(accelerator.device, accelerator.mixed_precision, peak_flops)
        usage = throughput.summary(
            model,
            seconds=self.train_seconds,
            real_tokens=self.real_tokens,
            padded_tokens=self.padded_tokens,
            real_squared=self.real_squared,
            padded_squared=self.padded_squared,
            peak=peak,
            peak_source=peak_source,
            num_processes=self._processes,
        )
        return {
            "train_samples": self.train_samples,
            "train_runtime_s": round(self.train_seconds, 3),
            "train_samples_per_second": round(self.train_samples / max(self.train_seconds, 1e-9), 3),
            # The main process's CPU seconds (per process: several processes each spend about as much).
            "train_cpu_s": round(self.train_cpu_seconds, 3),
            "train_samples_per_cpu_second": round(
                self.train_samples / self._processes / max(self.train_cpu_seconds, 1e-9), 3
            ),
            "padded_tokens": self.padded_tokens,
            "real_tokens": self.real_tokens,
            **usage,
            "eval_runtime_s": round(self.eval_seconds, 3),
        }


@dataclass
class _Window:
    """The training rows' window: the mean loss over the batches since the last row."""

    loss: torch.Tensor
    batches: int = 0
    # The last optimizer step's, before clipping (as Trainer logs it); a tensor, read only when a row
    # is logged, so that clipping costs no host sync per step on a GPU.
    grad_norm: torch.Tensor | None = None

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        self.loss += loss.detach().float()
        self.batches += 1
        if grad_norm is not None:
            self.grad_norm = grad_norm

    def reset(self) -> None:
        self.loss.zero_()
        self.batches = 0


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def _train_epoch(run: _Run, loader: Any, intervals: _Intervals, stop_requested: Callable[[], bool]) -> bool:
    """One pass over the training batches, then the epoch's evaluation and save; whether training
    is over (max steps or early stopping)."""
    accelerator, progress = run.accelerator, run.progress
    run.model.train()
    window = _Window(torch.zeros((), device=accelerator.device))
    done = False
    with run.meter.training():
        for batch in loader:
            loss, grad_norm = train_step(run, batch, intervals.max_grad_norm)
            window.add(loss, grad_norm)
            run.meter.count(batch)
            if not accelerator.sync_gradients:
                continue
            progress.completed_steps += 1
            step = progress.completed_steps
            run.uploads.poll()  # declares the checkpoint uploading beside these steps once it is in
            done = step >= run.schedule.max_train_steps
            if step % intervals.logging_steps == 0 or done:
                _log_training(run, window)
            with run.meter.paused():
                done = _after_step(run, intervals) or done
            if done:
                break
            if _stop_agreed(accelerator, stop_requested):
                _save_checkpoint(run, {})
                run.uploads.wait()  # a drain declares its checkpoint before the process exits
                raise Preempted(step, checkpoints.checkpoint_path(run.checkpoints_dir, step))
    if window.batches:  # an epoch that ended between two logging steps
        _log_training(run, window)
    if not progress.stopped_early:
        done = _end_of_epoch(run, intervals) or done
    return done


def train_step(
    run: _Run, batch: dict[str, torch.Tensor], max_grad_norm: float | None
) -> tuple[Any, torch.Tensor | None]:
    """Forward, backward and (once the accumulated batches are in) the optimizer step; the loss,
    and the gradients' norm before clipping when this step clipped them."""
    accelerator = run.accelerator
    grad_norm = None
    with accelerator.accumulate(run.model):
        loss = run.model(**batch).loss
        accelerator.backward(loss)
        if max_grad_norm is not None and accelerator.sync_gradients:
            # Trainer's clipping: the global norm over every parameter, unscaled first under fp16.
            grad_norm = accelerator.clip_grad_norm_(run.model.parameters(), max_grad_norm)
        run.optimizer.step()
        run.lr_scheduler.step()
        run.optimizer.zero_grad()
    return loss, grad_norm


def _after_step(run: _Run, intervals: _Intervals) -> bool:
    """Evaluate and save when the step strategies say so; whether early stopping ends the training."""
    step = run.progress.completed_steps
    metrics: dict[str, float] = {}
    if intervals.evaluates_at(step):
        metrics = _evaluate_all(run, threshold=intervals.early_stopping_threshold)
    if intervals.saves_at(step):
        _save_checkpoint(run, metrics)
    return bool(metrics) and _stops_early(run, intervals.early_stopping_patience)


def _end_of_epoch(run: _Run, intervals: _Intervals) -> bool:
    """The epoch strategies' evaluation and save; whether early stopping ends the training."""
    metrics: dict[str, float] = {}
    if intervals.eval_strategy == "epoch":
        metrics = _evaluate_all(run, threshold=intervals.early_stopping_threshold)
    if intervals.save_strategy == "epoch":
        _save_checkpoint(run, metrics)
    return bool(metrics) and _stops_early(run, intervals.early_stopping_patience)


def _stops_early(run: _Run, patience: int | None) -> bool:
    progress = run.progress
    if patience is None or progress.evaluations_without_improvement < patience:
        return False
    progress.stopped_early = True
    run.report.log(
        f"early stopping at step {progress.completed_steps}: {progress.evaluations_without_improvement} "
        f"evaluations without improving {progress.ranking} (best {progress.best_value:.4f} at step "
        f"{progress.best_step})",
        data={"step": progress.completed_steps, "best_step": progress.best_step},
    )
    return True


def _log_training(run: _Run, window: _Window) -> None:
    mean_loss = run.accelerator.reduce(window.loss / max(window.batches, 1), reduction="mean")
    values = {"loss": float(mean_loss.item()), "learning_rate": float(run.lr_scheduler.get_last_lr()[0])}
    if window.grad_norm is not None:
        values["grad_norm"] = float(window.grad_norm)
    run.report.metrics(
        step=run.progress.completed_steps, epoch=run.progress.epoch, split=TRAIN_SPLIT, values=values
    )
    window.reset()


def _stop_agreed(accelerator: Accelerator, stop_requested: Callable[[], bool]) -> bool:
    """Whether to stop now; with several processes all of them must stop at the same step, so the
    flags are summed across processes (one tiny collective per step, only when there are several)."""
    if accelerator.num_processes == 1:
        return stop_requested()
    flag = torch.tensor([1 if stop_requested() else 0], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction="sum").item() > 0)


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


def _evaluate_all(run: _Run, *, threshold: float = 0.0) -> dict[str, float]:
    """Evaluate every split (MNLI: matched and mismatched); the `eval` split's metrics."""
    progress = run.progress
    main: dict[str, float] = {}
    runtimes: dict[str, float] = {}
    for split, dataloader in run.eval_dataloaders.items():
        started = time.perf_counter()
        metrics = evaluate(run.model, dataloader, run.accelerator, run.plan, order=run.eval_orders.get(split))
        runtimes[split] = round(time.perf_counter() - started, 3)
        run.meter.eval_seconds += runtimes[split]
        ranking = progress.ranking if split == EVAL_SPLIT else None
        run.report.metrics(
            step=progress.completed_steps,
            epoch=progress.epoch,
            split=split,
            values=metrics,
            best_metric=ranking,
        )
        if split == EVAL_SPLIT:
            main = metrics
    progress.record_evaluation(main, threshold=threshold)
    summary = ", ".join(f"{k} {v:.4f}" for k, v in main.items())
    run.report.log(
        f"epoch {progress.epoch:g} step {progress.completed_steps}: {summary} "
        f"(evaluated in {sum(runtimes.values()):.1f}s)",
        data={"step": progress.completed_steps, "metrics": main, "eval_runtime_s": runtimes},
    )
    return main


def evaluate(
    model: Any,
    dataloader: DataLoader,
    accelerator: Accelerator,
    plan: MetricPlan,
    *,
    order: np.ndarray | None = None,
) -> dict[str, float]:
    """The plan's metrics and the loss over a whole split, gathered from every process; `order`:
    the dataloader serves the split's rows in this order (sorted evaluation), put back before the
    metrics so that they are computed exactly as on unsorted batches."""
    model.eval()
    all_logits, all_labels = [], []
    with torch.no_grad():
        for batch in dataloader:
            logits = model(**batch).logits
            logits, labels = accelerator.gather_for_metrics((logits.float(), batch["labels"]))
            all_logits.append(logits.cpu())
            all_labels.append(labels.cpu())
    model.train()
    logits = torch.cat(all_logits)
    labels = torch.cat(all_labels)
    if order is not None:
        logits, labels = in_row_order(logits, order), in_row_order(labels, order)
    if logits.shape[-1] == 1:  # regression (num_labels 1)
        predictions = logits.squeeze(-1)
        loss = torch.nn.functional.mse_loss(predictions, labels.float())
    else:
        predictions = logits.argmax(dim=-1)
        loss = torch.nn.functional.cross_entropy(logits, labels.long())
    metrics = compute_plan(plan, predictions.numpy(), labels.numpy())
    metrics["loss"] = float(loss)
    return metrics


def _ranking_metric(plan: MetricPlan, requested: str | None) -> str:
    """The metric that ranks evaluations; a job on its own files learns only here what its data reports."""
    try:
        return ranking_metric(plan, requested)
    except ValueError as exc:
        raise JobFailed(str(exc), field="metric_for_best_model") from exc


# ---------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------


def _keep_model_files_in_checkpoints(accelerator: Accelerator, tokenizer: PreTrainedTokenizerBase) -> None:
    """Make every checkpoint a model: `save_state` hands its model to these hooks, which write it
    with `save_pretrained` (the adapter, for LoRA) beside the tokenizer, and `load_state` reads it
    back from there. Accelerate then writes the optimizer, scheduler and RNG states only, and no
    second copy of the weights."""

    def save(models: list[Any], weights: list[Any], folder: str) -> None:
        if accelerator.is_main_process:
            save_model_files(accelerator.unwrap_model(models[0]), tokenizer, Path(folder))
        weights.pop(0)

    def load(models: list[Any], folder: str) -> None:
        load_model_files(accelerator.unwrap_model(models.pop(0)), Path(folder))

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)


def _save_checkpoint(run: _Run, metrics: dict[str, float]) -> None:
    accelerator, progress = run.accelerator, run.progress
    step = progress.completed_steps
    if progress.last_save_step == step:
        return
    final = checkpoints.checkpoint_path(run.checkpoints_dir, step)
    staging = checkpoints.staging_path(final)
    staging.mkdir(parents=True, exist_ok=True)  # every rank writes into it; none may find it missing
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))  # every process writes its part (optimizer shards, RNG)
    accelerator.wait_for_everyone()  # all parts are written before the folder is renamed
    if accelerator.is_main_process:
        progress.state().write(staging)
        checkpoints.publish(staging, final)
    accelerator.wait_for_everyone()
    progress.last_save_step = step
    is_best = bool(metrics) and progress.best_step == step
    if accelerator.is_main_process:
        # Uploaded beside the next steps, declared once it is in the store (worker/checkpoint_uploads.py).
        run.uploads.submit(SavedCheckpoint(step, progress.epoch, final, metrics, is_best))
    accelerator.wait_for_everyone()


def _declare_checkpoint(run: _Run, saved: SavedCheckpoint) -> None:
    """Write a checkpoint's row (it is in the store), then rotate: the main process, training thread."""
    path = run.storage.checkpoint_location(saved.folder)
    run.report.checkpoint(
        step=saved.step, epoch=saved.epoch, path=path, metrics=saved.metrics, is_best=saved.is_best
    )
    deleted = run.storage.rotate(keep=run.spec.save_total_limit, best_step=run.progress.best_step)
    if deleted:
        run.report.checkpoints_deleted(deleted)


def _resume(run: _Run, folder: Path, accumulation: int) -> tuple[int, int]:
    """Load a checkpoint; the epoch to start in and the batches of it already done."""
    run.accelerator.load_state(str(folder))
    state = checkpoints.TrainingState.read(folder)
    progress = run.progress
    progress.completed_steps = state.completed_steps
    progress.best_value, progress.best_step = state.best_value, state.best_step
    progress.evaluations_without_improvement = state.evaluations_without_improvement
    progress.last_save_step = state.completed_steps
    run.report.log(
        f"resumed from {folder.name} at step {progress.completed_steps}",
        data={"checkpoint": folder.name, "step": progress.completed_steps},
    )
    epoch, steps_into_epoch = divmod(state.completed_steps, progress.steps_per_epoch)
    return epoch, steps_into_epoch * accumulation


# ---------------------------------------------------------------------------------------------------
# Set-up: data, model, data loaders, schedule
# ---------------------------------------------------------------------------------------------------


def _tokenize(
    accelerator: Accelerator,
    raw: RawData,
    tokenizer: PreTrainedTokenizerBase,
    spec: JobSpec,
    cache_dir: Path,
    report: _MainProcessReporter,
) -> TokenizedData:
    with accelerator.main_process_first():  # rank 0 tokenises and fills the cache; the others read it
        data = tokenize_data(
            raw,
            tokenizer,
            max_length=spec.max_length,
            pad_to_max_length=spec.pad_to_max_length,
            cache_dir=cache_dir,
        )
    report.log(
        f"data: {len(data.train)} training rows, "
        + ", ".join(f"{len(ds)} {split} rows" for split, ds in data.evals.items())
        + (" (tokenised rows from the cache)" if data.cache_hit else " (tokenised and cached)"),
        data={"cache_hit": data.cache_hit, "cache_key": data.cache_key},
    )
    return data


def _build_model(model_source: str, spec: JobSpec, raw: RawData, num_labels: int) -> Any:
    model = load_model(
        model_source,
        num_labels=num_labels,
        label_names=raw.label_names,
        task_name=spec.task_name,
        cls_dropout=spec.cls_dropout,
        ignore_mismatched_sizes=spec.ignore_mismatched_sizes,
    )
    # The name the job gave, not this worker's path to it: PEFT names the base by it in the adapter's
    # adapter_config.json and model card, so that a downloaded adapter finds its base elsewhere.
    model.name_or_path = model.config.name_or_path = spec.model_name_or_path
    if not spec.apply_lora:
        return model
    return apply_lora(
        model,
        r=spec.lora_r,
        alpha=spec.lora_alpha,
        dropout=spec.lora_dropout,
        target_modules=spec.lora_target_modules,
    )


def make_dataloaders(
    data: TokenizedData,
    tokenizer: PreTrainedTokenizerBase,
    *,
    pad_to_max_length: bool,
    group_by_length: bool,
    shuffle_length_groups: bool = False,
    group_eval_by_length: bool = False,
    train_batch_size: int,
    eval_batch_size: int,
    seed: int,
    pad_to_multiple_of: int | None = None,
) -> tuple[DataLoader, dict[str, DataLoader], LengthGroupedSampler | None, dict[str, np.ndarray | None]]:
    """The training loader, the evaluation loaders and, for sorted evaluation, each split's order."""
    collate = _collator(tokenizer, pad_to_max_length=pad_to_max_length, pad_to_multiple_of=pad_to_multiple_of)
    sampler = None
    if group_by_length:
        # Batches of similar lengths waste less compute on padding (Trainer's group_by_length).
        lengths = pyarrow.compute.list_value_length(data.train.data.column("input_ids")).to_pylist()
        grouped = ShuffledLengthGroups if shuffle_length_groups else LengthGroupedSampler
        sampler = grouped(train_batch_size, lengths=lengths)
    train = DataLoader(
        data.train,
        shuffle=sampler is None,
        sampler=sampler,
        collate_fn=collate,
        batch_size=train_batch_size,
        # A generator of its own: otherwise each epoch's iterator draws from the global RNG, and a
        # resumed run's dropout masks would drift from those of the run it continues.
        generator=torch.Generator().manual_seed(seed),
    )
    evals: dict[str, DataLoader] = {}
    orders: dict[str, np.ndarray | None] = {}
    for split, rows in data.evals.items():
        orders[split] = None
        if group_eval_by_length:
            rows, orders[split] = longest_first(rows)
        evals[split] = DataLoader(rows, collate_fn=collate, batch_size=eval_batch_size)
    return train, evals, sampler, orders


class ShuffledLengthGroups(LengthGroupedSampler):
    """LengthGroupedSampler's batches, in a shuffled order.

    Trainer's sampler sorts megabatches of 50 batches by length, so an epoch runs as a few stretches
    of batches from the longest rows to the shortest. These are the same batches (the same rows
    together, so the same padding), drawn in a random order (from the same generator, so a seed and
    an epoch give one order); a last, partial batch stays last, where the DataLoader cuts it."""

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        size = self.batch_size
        full = len(indices) // size
        batches = [indices[i * size : (i + 1) * size] for i in range(full)]
        for position in torch.randperm(full, generator=self.generator).tolist():
            yield from batches[position]
        yield from indices[full * size :]


def pad_multiple(accelerator: Accelerator) -> int | None:
    """8 under mixed precision on CUDA, where tensor cores want dimensions in multiples of 8 (the
    script's rule, which it applies on every device); elsewhere (CPUs) it only adds padded tokens."""
    return 8 if accelerator.mixed_precision != "no" and accelerator.device.type == "cuda" else None


def _collator(
    tokenizer: PreTrainedTokenizerBase, *, pad_to_max_length: bool, pad_to_multiple_of: int | None
) -> Callable[..., Any]:
    if pad_to_max_length:
        return default_data_collator
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def _epoch_batches(run: _Run, epoch: int, *, skip: int) -> Any:
    """The epoch's training batches, in the order (seed, epoch) gives them; on resuming, without
    the `skip` first ones (already trained on)."""
    assert run.spec.seed is not None, "the API records a seed on every job"
    if run.length_sampler is not None:
        run.length_sampler.generator = torch.Generator().manual_seed(run.spec.seed + epoch)
    if hasattr(run.train_dataloader, "set_epoch"):
        run.train_dataloader.set_epoch(epoch)
    if skip:
        return run.accelerator.skip_first_batches(run.train_dataloader, skip)
    return run.train_dataloader


# ---------------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------------


def _final_model(run: _Run) -> dict[str, float]:
    """Save the final model (the best checkpoint's, on request); the evaluation of its weights."""
    progress, spec = run.progress, run.spec
    final_metrics = progress.eval_metrics.get(progress.completed_steps, {})
    if spec.load_best_model_at_end and progress.best_step is not None:
        best = checkpoints.checkpoint_path(run.checkpoints_dir, progress.best_step)
        if run.accelerator.is_main_process:
            run.storage.local_checkpoint(progress.best_step)  # a resumed attempt's may be in the store only
        run.accelerator.wait_for_everyone()
        run.accelerator.load_state(str(best))
        final_metrics = progress.eval_metrics.get(progress.best_step, final_metrics)
        run.report.log(
            f"loaded the best checkpoint (step {progress.best_step}, {progress.ranking} "
            f"{progress.best_value:.4f}) for the final model"
        )
    _save_final_model(run)
    return final_metrics


def _save_final_model(run: _Run) -> None:
    accelerator, output_dir, apply_lora = run.accelerator, run.output_dir, run.spec.apply_lora
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(run.model)
    if accelerator.is_main_process:
        # LoRA: this saves the adapter (and the trained classifier), not the frozen backbone.
        save_model_files(unwrapped, run.tokenizer, output_dir)
        job_id, what = run.storage.job_id, "LoRA adapter" if apply_lora else "model"
        run.report.log(
            f"saved the {what} and tokenizer: {download_command(job_id)} (files at {artifact_path(job_id)})"
        )
        if apply_lora and run.spec.save_merged_model:
            merged_dir = output_dir / "merged"
            unwrapped.merge_and_unload().save_pretrained(str(merged_dir))
            run.tokenizer.save_pretrained(str(merged_dir))
            run.report.log(f"saved the model with the adapter merged in: {artifact_path(job_id, 'merged')}/…")
    accelerator.wait_for_everyone()


def _write_outputs(run: _Run) -> None:
    """Predictions: GLUE's submission file(s) for the task's test split, and test_file's."""
    spec = run.spec
    if spec.do_predict and spec.task_name:
        write_glue_submission(
            run.accelerator, run.model, run.tokenizer, spec, run.settings, run.output_dir, run.report.log
        )
    if run.data.test is not None:
        _write_predictions(run)


def _write_predictions(run: _Run) -> None:
    """Predictions for test_file, like run_glue.py's predict_results file."""
    assert run.data.test is not None
    accelerator, spec, label_names = run.accelerator, run.spec, run.raw.label_names
    test = run.data.test.remove_columns([c for c in run.data.test.column_names if c == "labels"])
    order = None
    if spec.group_eval_by_length:
        test, order = longest_first(test)
    collate = _collator(run.tokenizer, pad_to_max_length=spec.pad_to_max_length, pad_to_multiple_of=None)
    dataloader = accelerator.prepare(
        DataLoader(test, collate_fn=collate, batch_size=spec.per_device_eval_batch_size)
    )
    run.model.eval()
    outputs = []
    with torch.no_grad():
        for batch in dataloader:
            outputs.append(accelerator.gather_for_metrics(run.model(**batch).logits.float()).cpu())
    restored = torch.cat(outputs)
    logits = (in_row_order(restored, order) if order is not None else restored).numpy()
    if accelerator.is_main_process:
        path = run.output_dir / "predict_results.tsv"
        with path.open("w") as out:
            out.write("index\tprediction\n")
            for index, row in enumerate(logits):
                if label_names is None:
                    out.write(f"{index}\t{float(row[0]):.3f}\n")
                else:
                    out.write(f"{index}\t{label_names[int(np.argmax(row))]}\n")
        where = artifact_path(run.storage.job_id, path.name)
        run.report.log(f"wrote {len(logits)} test predictions: {where}")


def _summary(run: _Run, final_metrics: dict[str, float]) -> dict[str, Any]:
    """The run's summary: the job's `result`."""
    progress, accelerator = run.progress, run.accelerator
    return {
        **run.parameter_counts,
        "completed_steps": progress.completed_steps,
        "epochs": progress.epoch,
        "stopped_early": progress.stopped_early,
        **run.meter.summary(accelerator.unwrap_model(run.model), run.settings.peak_flops),
        "final_metrics": final_metrics,
        "best_step": progress.best_step,
        "model_dir": str(run.output_dir),
        "tokenized_from_cache": run.data.cache_hit,
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "mixed_precision": accelerator.mixed_precision,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


class _MainProcessReporter:
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
