"""The training loop: run_glue_no_trainer.py's behaviour with Accelerate, DB-free.

It reads like accelerate's nlp_example: Accelerator, seed, data, model, optimizer, scheduler,
`prepare`, then per epoch train → evaluate → log → save. Everything it learns goes to a `Reporter`
(the runner's, which writes the database); only the main process reports.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import time
from collections.abc import Callable
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

from shared.config import Settings
from shared.errors import JobFailed
from shared.spec import JobSpec
from shared.tasks import (
    EVAL_SPLIT,
    FILE_CLASSIFICATION_METRICS,
    FILE_REGRESSION_METRICS,
    LOSS_METRIC,
    TRAIN_SPLIT,
    greater_is_better,
)
from worker import checkpoints
from worker.data import TokenizedData, load_raw_data, tokenize_data
from worker.glue_metric import compute_metrics
from worker.modeling import (
    apply_lora,
    load_model,
    load_tokenizer,
    make_optimizer,
    parameter_counts,
    resolve_model,
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


@dataclass
class _Progress:
    """Counters of the loop, kept together so the helpers below can read them."""

    best_metric: str
    completed_steps: int = 0
    steps_per_epoch: int = 1
    best_value: float | None = None
    best_step: int | None = None
    last_eval_step: int | None = None
    last_save_step: int | None = None
    eval_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    train_seconds: float = 0.0
    train_samples: int = 0
    padded_tokens: int = 0
    real_tokens: int = 0

    @property
    def epoch(self) -> float:
        return round(self.completed_steps / self.steps_per_epoch, 4)


def run_training(
    spec: JobSpec,
    settings: Settings,
    *,
    output_dir: Path,
    reporter: Reporter,
    resume_from: Path | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Fine-tune spec's model on spec's task; returns the run's summary (the job's `result`).

    `stop_requested` is asked after every optimizer step; once it says yes (in any process), the
    run saves a checkpoint at that step and raises Preempted.
    """
    if spec.fp16 and not torch.cuda.is_available():
        raise JobFailed("fp16 needs a CUDA GPU and this worker has none; use bf16 (it also runs on CPU)")
    accelerator = Accelerator(
        # Several processes and no GPU: accelerate runs them on the CPU over gloo only when told so.
        cpu=int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available(),
        mixed_precision=spec.mixed_precision,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        # Each epoch's order follows from (seed, epoch), so a resumed run sees the same batches.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    report = _MainProcessReporter(reporter, accelerator.is_main_process)
    assert spec.seed is not None, "the API records a seed on every job"
    set_seed(spec.seed)

    # --- data and model ---------------------------------------------------------------------------
    model_source = resolve_model(spec.model_name_or_path, settings)
    tokenizer = load_tokenizer(model_source, spec)
    raw = load_raw_data(spec, settings)
    best_metric = _best_metric(spec, raw.is_regression)
    with accelerator.main_process_first():  # rank 0 tokenises and fills the cache; the others read it
        data = tokenize_data(
            raw,
            tokenizer,
            max_length=spec.max_length,
            pad_to_max_length=spec.pad_to_max_length,
            cache_dir=settings.cache_dir,
        )
    report.log(
        f"data: {len(data.train)} training rows, "
        + ", ".join(f"{len(ds)} {split} rows" for split, ds in data.evals.items())
        + (" (tokenised rows from the cache)" if data.cache_hit else " (tokenised and cached)"),
        data={"cache_hit": data.cache_hit, "cache_key": data.cache_key},
    )
    model: Any = load_model(
        model_source,
        spec,
        num_labels=1 if raw.is_regression else len(raw.label_names or ()),
        label_names=raw.label_names,
    )
    if spec.apply_lora:
        model = apply_lora(model, spec)
    counts = parameter_counts(model)
    report.log(
        f"parameters: {counts['trainable_params']:,} trainable of {counts['total_params']:,} "
        f"({counts['trainable_percent']}%)",
        data=counts,
    )

    train_dataloader, eval_dataloaders, length_sampler = _make_dataloaders(data, tokenizer, spec, accelerator)
    optimizer = make_optimizer(model, spec)

    model, optimizer, train_dataloader, *prepared_evals = accelerator.prepare(
        model, optimizer, train_dataloader, *eval_dataloaders.values()
    )
    eval_dataloaders = dict(zip(eval_dataloaders, prepared_evals, strict=True))

    # --- the schedule: the script's arithmetic, in optimizer updates of one process --------------
    # Counted after `prepare`, which shards the batches across processes.
    steps_per_epoch = math.ceil(len(train_dataloader) / spec.gradient_accumulation_steps)
    max_train_steps = spec.max_train_steps or spec.num_train_epochs * steps_per_epoch
    num_epochs = math.ceil(max_train_steps / steps_per_epoch)
    warmup_steps = spec.num_warmup_steps or math.ceil(spec.warmup_ratio * max_train_steps)
    # A prepared scheduler steps once per process per update, hence the factors (as in the script).
    lr_scheduler = accelerator.prepare(
        get_scheduler(
            name=spec.lr_scheduler_type,
            optimizer=optimizer,
            num_warmup_steps=warmup_steps * accelerator.num_processes,
            num_training_steps=max_train_steps * accelerator.num_processes,
        )
    )
    progress = _Progress(steps_per_epoch=steps_per_epoch, best_metric=best_metric)
    checkpoints_dir = output_dir / "checkpoints"

    start_epoch, skip_batches = 0, 0
    if resume_from is not None:
        start_epoch, skip_batches = _resume(accelerator, resume_from, progress, spec)
        report.log(
            f"resumed from {resume_from.name} at step {progress.completed_steps}",
            data={"checkpoint": str(resume_from), "step": progress.completed_steps},
        )

    report.log(
        f"training: {num_epochs} epochs, {max_train_steps} optimizer steps, "
        f"batch {spec.per_device_train_batch_size} × {accelerator.num_processes} processes × "
        f"{spec.gradient_accumulation_steps} accumulation, on {accelerator.device}, "
        f"mixed precision {accelerator.mixed_precision}",
        data={"num_epochs": num_epochs, "max_train_steps": max_train_steps, "warmup_steps": warmup_steps},
    )

    def evaluate_now() -> dict[str, float]:
        return _evaluate_all(model, eval_dataloaders, accelerator, raw.is_regression, spec, progress, report)

    def save_now(metrics: dict[str, float]) -> None:
        _save_checkpoint(accelerator, checkpoints_dir, progress, spec, metrics, report)

    # --- the loop -----------------------------------------------------------------------------------
    window_loss = torch.zeros((), device=accelerator.device)
    window_batches = 0
    real_tokens = torch.zeros((), dtype=torch.long, device=accelerator.device)
    for epoch in range(start_epoch, num_epochs):
        model.train()
        _start_epoch(train_dataloader, length_sampler, spec, epoch)
        loader = train_dataloader
        if epoch == start_epoch and skip_batches:
            loader = accelerator.skip_first_batches(train_dataloader, skip_batches)
        epoch_started = time.perf_counter()
        for batch in loader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            window_loss += loss.detach().float()
            window_batches += 1
            progress.train_samples += batch["input_ids"].shape[0] * accelerator.num_processes
            progress.padded_tokens += batch["input_ids"].numel() * accelerator.num_processes
            real_tokens += batch["attention_mask"].sum()
            if not accelerator.sync_gradients:
                continue
            progress.completed_steps += 1
            step = progress.completed_steps
            is_last = step >= max_train_steps
            if step % spec.logging_steps == 0 or is_last:
                _log_training(accelerator, report, progress, window_loss, window_batches, lr_scheduler)
                window_loss.zero_()
                window_batches = 0
            pause = time.perf_counter()
            metrics: dict[str, float] = {}
            if spec.eval_strategy == "steps" and spec.eval_steps and step % spec.eval_steps == 0:
                metrics = evaluate_now()
            if spec.save_strategy == "steps" and spec.save_steps and step % spec.save_steps == 0:
                save_now(metrics)
            epoch_started += time.perf_counter() - pause  # evaluation and saving are not training time
            if is_last:
                break
            if _stop_agreed(accelerator, stop_requested):
                save_now({})
                raise Preempted(step, checkpoints.checkpoint_path(checkpoints_dir, step))
        progress.train_seconds += time.perf_counter() - epoch_started
        if window_batches:  # an epoch that ended between two logging steps
            _log_training(accelerator, report, progress, window_loss, window_batches, lr_scheduler)
            window_loss.zero_()
            window_batches = 0
        metrics = evaluate_now() if spec.eval_strategy == "epoch" else {}
        if spec.save_strategy == "epoch":
            save_now(metrics)
        if progress.completed_steps >= max_train_steps:
            break

    if spec.eval_strategy != "no" and progress.last_eval_step != progress.completed_steps:
        evaluate_now()  # so that every run ends with the metrics of its final weights
    progress.real_tokens = int(accelerator.reduce(real_tokens, reduction="sum").item())

    # --- the final model -----------------------------------------------------------------------------
    final_metrics = progress.eval_metrics.get(progress.completed_steps, {})
    if spec.load_best_model_at_end and progress.best_step is not None:
        best = checkpoints.checkpoint_path(checkpoints_dir, progress.best_step)
        accelerator.load_state(str(best))
        final_metrics = progress.eval_metrics.get(progress.best_step, final_metrics)
        report.log(
            f"loaded the best checkpoint (step {progress.best_step}, {best_metric} "
            f"{progress.best_value:.4f}) for the final model"
        )
    _save_final_model(accelerator, model, tokenizer, output_dir, spec, report)
    if spec.do_predict and spec.task_name:  # GLUE's submission file(s) for the task's test split
        write_glue_submission(accelerator, model, tokenizer, spec, settings, output_dir, report.log)
    if data.test is not None:
        _write_predictions(accelerator, model, data, tokenizer, spec, raw.label_names, output_dir, report)

    return {
        **counts,
        "completed_steps": progress.completed_steps,
        "epochs": progress.epoch,
        "train_samples": progress.train_samples,
        "train_runtime_s": round(progress.train_seconds, 3),
        "train_samples_per_second": round(progress.train_samples / max(progress.train_seconds, 1e-9), 3),
        "padded_tokens": progress.padded_tokens,
        "real_tokens": progress.real_tokens,
        "final_metrics": final_metrics,
        "best_step": progress.best_step,
        "model_dir": str(output_dir),
        "tokenized_from_cache": data.cache_hit,
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "mixed_precision": accelerator.mixed_precision,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


# ---------------------------------------------------------------------------------------------------
# Data loaders
# ---------------------------------------------------------------------------------------------------


def _make_dataloaders(
    data: TokenizedData, tokenizer: PreTrainedTokenizerBase, spec: JobSpec, accelerator: Accelerator
) -> tuple[DataLoader, dict[str, DataLoader], LengthGroupedSampler | None]:
    collate: Callable[..., Any]
    if spec.pad_to_max_length:
        collate = default_data_collator
    else:
        # Padding to a multiple of 8 lets tensor cores work under mixed precision (the script's rule).
        multiple = 8 if accelerator.mixed_precision != "no" else None
        collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)
    sampler = None
    if spec.group_by_length:
        # Batches of similar lengths waste less compute on padding (Trainer's group_by_length).
        lengths = pyarrow.compute.list_value_length(data.train.data.column("input_ids")).to_pylist()
        sampler = LengthGroupedSampler(spec.per_device_train_batch_size, lengths=lengths)
    assert spec.seed is not None
    train = DataLoader(
        data.train,
        shuffle=sampler is None,
        sampler=sampler,
        collate_fn=collate,
        batch_size=spec.per_device_train_batch_size,
        # A generator of its own: otherwise each epoch's iterator draws from the global RNG, and a
        # resumed run's dropout masks would drift from those of the run it continues.
        generator=torch.Generator().manual_seed(spec.seed),
    )
    evals = {
        split: DataLoader(ds, collate_fn=collate, batch_size=spec.per_device_eval_batch_size)
        for split, ds in data.evals.items()
    }
    return train, evals, sampler


def _start_epoch(
    dataloader: Any, length_sampler: LengthGroupedSampler | None, spec: JobSpec, epoch: int
) -> None:
    assert spec.seed is not None
    if length_sampler is not None:
        length_sampler.generator = torch.Generator().manual_seed(spec.seed + epoch)
    if hasattr(dataloader, "set_epoch"):
        dataloader.set_epoch(epoch)


# ---------------------------------------------------------------------------------------------------
# Logging, evaluation, checkpoints
# ---------------------------------------------------------------------------------------------------


def _log_training(
    accelerator: Accelerator,
    report: _MainProcessReporter,
    progress: _Progress,
    window_loss: torch.Tensor,
    window_batches: int,
    lr_scheduler: Any,
) -> None:
    mean_loss = accelerator.reduce(window_loss / max(window_batches, 1), reduction="mean")
    values = {"loss": float(mean_loss.item()), "learning_rate": float(lr_scheduler.get_last_lr()[0])}
    report.metrics(step=progress.completed_steps, epoch=progress.epoch, split=TRAIN_SPLIT, values=values)


def _evaluate_all(
    model: Any,
    dataloaders: dict[str, DataLoader],
    accelerator: Accelerator,
    is_regression: bool,
    spec: JobSpec,
    progress: _Progress,
    report: _MainProcessReporter,
) -> dict[str, float]:
    """Evaluate every split (MNLI: matched and mismatched); the `eval` split's metrics."""
    main: dict[str, float] = {}
    for split, dataloader in dataloaders.items():
        metrics = evaluate(
            model, dataloader, accelerator, task_name=spec.task_name, is_regression=is_regression
        )
        report.metrics(
            step=progress.completed_steps,
            epoch=progress.epoch,
            split=split,
            values=metrics,
            best_metric=progress.best_metric if split == EVAL_SPLIT else None,
        )
        if split == EVAL_SPLIT:
            main = metrics
    progress.last_eval_step = progress.completed_steps
    progress.eval_metrics[progress.completed_steps] = main
    value = main.get(progress.best_metric)
    if value is not None and _improves(value, progress.best_value, progress.best_metric):
        progress.best_value, progress.best_step = value, progress.completed_steps
    summary = ", ".join(f"{k} {v:.4f}" for k, v in main.items())
    report.log(
        f"epoch {progress.epoch:g} step {progress.completed_steps}: {summary}",
        data={"step": progress.completed_steps, "metrics": main},
    )
    return main


def _stop_agreed(accelerator: Accelerator, stop_requested: Callable[[], bool]) -> bool:
    """Whether to stop now; with several processes all of them must stop at the same step, so the
    flags are summed across processes (one tiny collective per step, only when there are several)."""
    if accelerator.num_processes == 1:
        return stop_requested()
    flag = torch.tensor([1 if stop_requested() else 0], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction="sum").item() > 0)


def _best_metric(spec: JobSpec, is_regression: bool) -> str:
    """The metric that ranks evaluations; for a job on its own files, one that the labels allow."""
    metric = spec.best_metric(is_regression=is_regression)
    if spec.task_name is None and spec.metric_for_best_model is not None:
        reported = (*(FILE_REGRESSION_METRICS if is_regression else FILE_CLASSIFICATION_METRICS), LOSS_METRIC)
        if metric not in reported:
            kind = "scores (regression)" if is_regression else "labels (classification)"
            raise JobFailed(
                f"metric_for_best_model {metric!r} is not reported for this data, whose {kind} give "
                f"{', '.join(reported)}",
                field="metric_for_best_model",
            )
    return metric


def _improves(value: float, best: float | None, metric: str) -> bool:
    if best is None:
        return True
    return value > best if greater_is_better(metric) else value < best


def evaluate(
    model: Any,
    dataloader: DataLoader,
    accelerator: Accelerator,
    *,
    task_name: str | None,
    is_regression: bool,
) -> dict[str, float]:
    """The GLUE metrics and the loss over a whole split, gathered from every process."""
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
    if is_regression:
        predictions = logits.squeeze(-1)
        loss = torch.nn.functional.mse_loss(predictions, labels.float())
    else:
        predictions = logits.argmax(dim=-1)
        loss = torch.nn.functional.cross_entropy(logits, labels.long())
    metrics = compute_metrics(task_name, predictions.numpy(), labels.numpy(), is_regression=is_regression)
    metrics["loss"] = float(loss)
    return metrics


def _save_checkpoint(
    accelerator: Accelerator,
    checkpoints_dir: Path,
    progress: _Progress,
    spec: JobSpec,
    metrics: dict[str, float],
    report: _MainProcessReporter,
) -> None:
    step = progress.completed_steps
    if progress.last_save_step == step:
        return
    final = checkpoints.checkpoint_path(checkpoints_dir, step)
    staging = checkpoints.staging_path(final)
    staging.mkdir(parents=True, exist_ok=True)  # every rank writes into it; none may find it missing
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))  # every process writes its part (optimizer shards, RNG)
    accelerator.wait_for_everyone()  # all parts are written before the folder is renamed
    if accelerator.is_main_process:
        state = checkpoints.TrainingState(step, progress.epoch, progress.best_value, progress.best_step)
        state.write(staging)
        checkpoints.publish(staging, final)
    accelerator.wait_for_everyone()
    progress.last_save_step = step
    report.checkpoint(
        step=step,
        epoch=progress.epoch,
        path=str(final),
        metrics=metrics,
        is_best=bool(metrics) and progress.best_step == step,
    )
    if accelerator.is_main_process:
        deleted = checkpoints.rotate(
            checkpoints_dir, keep=spec.save_total_limit, best_step=progress.best_step
        )
        if deleted:
            report.checkpoints_deleted(deleted)
    accelerator.wait_for_everyone()


def _resume(accelerator: Accelerator, folder: Path, progress: _Progress, spec: JobSpec) -> tuple[int, int]:
    """Load a checkpoint; the epoch to start in and the batches of it already done."""
    accelerator.load_state(str(folder))
    state = checkpoints.TrainingState.read(folder)
    progress.completed_steps = state.completed_steps
    progress.best_value, progress.best_step = state.best_value, state.best_step
    progress.last_save_step = state.completed_steps
    epoch, steps_into_epoch = divmod(state.completed_steps, progress.steps_per_epoch)
    return epoch, steps_into_epoch * spec.gradient_accumulation_steps


# ---------------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------------


def _save_final_model(
    accelerator: Accelerator,
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: Path,
    spec: JobSpec,
    report: _MainProcessReporter,
) -> None:
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        # LoRA: this saves the adapter (and the trained classifier), not the frozen backbone.
        unwrapped.save_pretrained(str(output_dir), is_main_process=True)
        tokenizer.save_pretrained(str(output_dir))
        report.log(
            f"saved the {'LoRA adapter' if spec.apply_lora else 'model'} and tokenizer to {output_dir}"
        )
        if spec.apply_lora and spec.save_merged_model:
            merged_dir = output_dir / "merged"
            unwrapped.merge_and_unload().save_pretrained(str(merged_dir))
            tokenizer.save_pretrained(str(merged_dir))
            report.log(f"saved the model with the adapter merged in to {merged_dir}")
    accelerator.wait_for_everyone()


def _write_predictions(
    accelerator: Accelerator,
    model: Any,
    data: TokenizedData,
    tokenizer: PreTrainedTokenizerBase,
    spec: JobSpec,
    label_names: list[str] | None,
    output_dir: Path,
    report: _MainProcessReporter,
) -> None:
    """Predictions for test_file, like run_glue.py's predict_results file."""
    assert data.test is not None
    test = data.test.remove_columns([c for c in data.test.column_names if c == "labels"])
    collate = default_data_collator if spec.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    dataloader = accelerator.prepare(
        DataLoader(test, collate_fn=collate, batch_size=spec.per_device_eval_batch_size)
    )
    model.eval()
    outputs = []
    with torch.no_grad():
        for batch in dataloader:
            outputs.append(accelerator.gather_for_metrics(model(**batch).logits.float()).cpu())
    logits = torch.cat(outputs).numpy()
    if accelerator.is_main_process:
        path = output_dir / "predict_results.tsv"
        with path.open("w") as out:
            out.write("index\tprediction\n")
            for index, row in enumerate(logits):
                if label_names is None:
                    out.write(f"{index}\t{float(row[0]):.3f}\n")
                else:
                    out.write(f"{index}\t{label_names[int(np.argmax(row))]}\n")
        report.log(f"wrote {len(logits)} test predictions to {path}")


class _MainProcessReporter:
    """Forwards to the real reporter on the main process only (one row per event, not one per GPU)."""

    def __init__(self, reporter: Reporter, is_main: bool) -> None:
        self._reporter = reporter
        self._is_main = is_main

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

    def checkpoint(
        self, *, step: int, epoch: float, path: str, metrics: dict[str, float], is_best: bool
    ) -> None:
        if self._is_main:
            self._reporter.checkpoint(step=step, epoch=epoch, path=path, metrics=metrics, is_best=is_best)

    def checkpoints_deleted(self, steps: list[int]) -> None:
        if self._is_main:
            self._reporter.checkpoints_deleted(steps)
