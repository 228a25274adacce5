"""The training loop: run_glue_no_trainer.py's behaviour (or Trainer's, under the trainer recipe)
with Accelerate, DB-free.

It reads like accelerate's examples/nlp_example.py: Accelerator, seed, data, model, optimizer and
scheduler, `prepare`, then per epoch train → evaluate (gather_for_metrics) → log → save. The helpers
live beside it in modules named for what they do: batches.py (data loaders, length-grouped batches),
checkpointing.py (saving, declaring, resuming), outputs.py (the final model, predictions, the summary),
meter.py (samples, tokens, seconds), progress.py (steps, the best evaluation, early stopping). Everything it
learns goes to a Reporter (reporter.py; the fleet's db_reporter.py writes the database) and to the
job's experiment trackers; only the main process reports.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase, get_scheduler
from transformers.trainer_pt_utils import LengthGroupedSampler

from shared.core.config import Settings
from shared.core.errors import JobFailed
from shared.jobspec.metric_rules import MetricPlan, metric_plan, ranking_metric
from shared.jobspec.schedule import Schedule, spec_schedule
from shared.jobspec.spec import JobSpec, job_kind
from shared.jobspec.tasks import EVAL_SPLIT, TRAIN_SPLIT
from worker.training import fast_dropout, outputs, tracking
from worker.training.batches import collator, epoch_batches, eval_dataloaders, make_dataloaders, pad_multiple
from worker.training.checkpointing import RunCheckpoints, keep_model_files_in_checkpoints
from worker.training.data import RawData, TokenizedData, in_row_order, load_raw_data, tokenize_data
from worker.training.determinism import DETERMINISTIC_ENVIRONMENT, deterministic_kernels
from worker.training.disk_space import check_room
from worker.training.glue_metric import compute_plan
from worker.training.job_storage import JobStorage
from worker.training.meter import LossWindow, Meter
from worker.training.modeling import apply_lora, load_model, load_tokenizer, make_optimizer, resolve_model
from worker.training.precision import CPU, CUDA, has_native_bf16, training_device, training_precision
from worker.training.progress import Progress
from worker.training.reporter import MainProcessReporter, Reporter, log_model, log_schedule

__all__ = ["Preempted", "Reporter", "evaluate", "run_training", "train_step"]


class Preempted(Exception):
    """The run stopped on request (its worker is shutting down) after saving a checkpoint at `step`;
    the next attempt resumes from it, so at most the step in flight is lost. A job that does not train
    stops between two evaluation batches with no checkpoint (None): the next attempt evaluates again."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        if checkpoint is None:
            message = "stopped on request between evaluation batches; nothing to save (evaluated again next)"
        else:
            message = f"stopped on request at step {step}; checkpoint {checkpoint.name} saved"
        super().__init__(message)
        self.step = step
        self.checkpoint = checkpoint


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
    before they are declared (worker/training/job_storage.py; default: `output_dir` alone).
    """
    storage = storage or JobStorage.local_only(output_dir)
    device = training_device()
    # Several processes and no GPU: accelerate runs them on the CPU over gloo only when told so.
    forced_cpu = int(os.environ.get("WORLD_SIZE", "1")) > 1 and device != CUDA
    device = CPU if forced_cpu else device
    precision = training_precision(spec, device=device, native_bf16=has_native_bf16(device))
    trackers = tracking.trackers_for(spec, output_dir)
    accelerator = Accelerator(
        cpu=forced_cpu,
        mixed_precision=precision.mixed_precision,
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
        report = MainProcessReporter(reporter, accelerator)
        if precision.warning:
            report.log(
                precision.warning, level="warning", data={"mixed_precision": precision.mixed_precision}
            )
        job = _Job(
            spec=spec,
            settings=settings,
            accelerator=accelerator,
            storage=storage,
            report=report,
            stop_requested=stop_requested,
        )
        with deterministic_kernels(spec.use_deterministic_algorithms):
            return _train(job, resume_from)
    finally:
        if trackers:
            accelerator.end_training()


def _train(job: _Job, resume_from: Path | None) -> dict[str, Any]:
    """nlp_example's `training_function`: set up, then per epoch train → evaluate → save; outputs."""
    spec = job.spec
    seed = _seed(spec, job.report)
    inputs = _load_inputs(job)
    if not spec.trains:
        return _without_training(job, inputs)
    run = _prepare(job, inputs, seed=seed)
    start_epoch, skip = 0, 0
    if resume_from is not None:
        start_epoch, skip = run.saved.resume(resume_from, accumulation=spec.gradient_accumulation_steps)
    log_schedule(spec, run.schedule, job.accelerator, job.report)

    # The loop: per epoch, train → evaluate → log → save (the last two also every so many steps).
    for epoch in range(start_epoch, run.schedule.num_epochs):
        batches = epoch_batches(
            job.accelerator,
            run.train_dataloader,
            run.length_sampler,
            seed=seed,
            epoch=epoch,
            skip=skip if epoch == start_epoch else 0,
        )
        if _train_epoch(run, batches, job.stop_requested):
            break
    if spec.evaluates and run.progress.last_eval_step != run.progress.completed_steps:
        _evaluate_all(run)  # so that every run ends with the metrics of its final weights
    return _save_outputs(job, inputs, run)


# ---------------------------------------------------------------------------------------------------
# Set-up: the seed, the data, the model, its optimizer and schedule, prepared
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Job:
    """What every part of one job reads, from the data to the summary (nlp_example: its arguments)."""

    spec: JobSpec
    settings: Settings
    accelerator: Accelerator
    storage: JobStorage  # where checkpoints and the final model go
    report: MainProcessReporter
    stop_requested: Callable[[], bool]  # asked after every optimizer step (the worker shutting down)


@dataclass(frozen=True, kw_only=True)
class _Inputs:
    """The job's rows, tokenised, and what reading them told: everything before the model is built."""

    model_source: str  # where this worker found the model (resolve_model)
    tokenizer: PreTrainedTokenizerBase
    raw: RawData
    data: TokenizedData
    num_labels: int
    plan: MetricPlan  # the metrics an evaluation computes
    ranking: str  # the metric that ranks evaluations


@dataclass(kw_only=True)
class _Evaluator:
    """What an evaluation needs once the model and its loaders are prepared."""

    spec: JobSpec
    accelerator: Accelerator
    model: Any
    evaluations: dict[str, tuple[DataLoader, np.ndarray | None]]  # each split's loader and row order
    plan: MetricPlan
    progress: Progress
    meter: Meter
    report: MainProcessReporter


@dataclass(kw_only=True)
class _Run(_Evaluator):
    """What the loop's steps share once everything is prepared (nlp_example keeps them in locals)."""

    train_dataloader: Any  # prepared: sharded across the processes
    length_sampler: LengthGroupedSampler | None  # group_by_length's sampler, reseeded every epoch
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    schedule: Schedule
    saved: RunCheckpoints
    masks: fast_dropout.MaskSource | None  # the dropout layers' generator under fast_dropout
    parameter_counts: dict[str, Any]  # log_model's, for the summary


def _seed(spec: JobSpec, report: MainProcessReporter) -> int:
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


def _load_inputs(job: _Job) -> _Inputs:
    """The data: the task's rows, read where the job says and tokenised (and cached)."""
    spec, settings = job.spec, job.settings
    model_source = resolve_model(spec.model_name_or_path, settings, registered=spec.registered_model)
    tokenizer = load_tokenizer(model_source, use_slow_tokenizer=spec.use_slow_tokenizer)
    raw = load_raw_data(spec, settings, model_folder=model_source)
    num_labels = 1 if raw.is_regression else len(raw.label_names or ())
    plan = metric_plan(spec.task_name, is_regression=raw.is_regression, num_labels=num_labels)
    ranking = _ranking_metric(plan, spec.metric_for_best_model)  # refused before the tokenising
    return _Inputs(
        model_source=model_source,
        tokenizer=tokenizer,
        raw=raw,
        data=_tokenize(job, raw, tokenizer),
        num_labels=num_labels,
        plan=plan,
        ranking=ranking,
    )


def _ranking_metric(plan: MetricPlan, requested: str | None) -> str:
    """The metric that ranks evaluations; a job on its own files learns only here what its data reports."""
    try:
        return ranking_metric(plan, requested)
    except ValueError as exc:
        raise JobFailed(str(exc), field="metric_for_best_model") from exc


def _tokenize(job: _Job, raw: RawData, tokenizer: PreTrainedTokenizerBase) -> TokenizedData:
    spec = job.spec
    with job.accelerator.main_process_first():  # rank 0 tokenises and fills the cache; the others read it
        data = tokenize_data(
            raw,
            tokenizer,
            max_length=spec.max_length,
            pad_to_max_length=spec.pad_to_max_length,
            cache_dir=job.settings.cache_dir,
        )
    job.report.log(
        (f"data: {len(data.train)} training rows, " if data.train is not None else "data: ")
        + ", ".join(f"{len(ds)} {split} rows" for split, ds in data.evals.items())
        + (" (tokenised rows from the cache)" if data.cache_hit else " (tokenised and cached)"),
        data={"cache_hit": data.cache_hit, "cache_key": data.cache_key},
    )
    return data


def _prepare(job: _Job, inputs: _Inputs, *, seed: int) -> _Run:
    """The loaders, the model, its optimizer and learning-rate schedule, prepared for this machine's
    processes, in nlp_example's order (the model is built after the loaders, as the seed's draws
    always were); the checkpoints the run saves and resumes from."""
    spec, accelerator, report = job.spec, job.accelerator, job.report
    train_dataloader, eval_dataloaders, length_sampler, eval_orders = make_dataloaders(
        inputs.data,
        inputs.tokenizer,
        pad_to_max_length=spec.pad_to_max_length,
        group_by_length=spec.group_by_length,
        shuffle_length_groups=spec.shuffle_length_groups,
        group_eval_by_length=spec.group_eval_by_length,
        train_batch_size=spec.per_device_train_batch_size,
        eval_batch_size=spec.per_device_eval_batch_size,
        seed=seed,
        pad_to_multiple_of=pad_multiple(accelerator),
    )
    model = _build_model(inputs.model_source, spec, inputs.raw, inputs.num_labels)
    masks = fast_dropout.for_job(model, spec.fast_dropout, accelerator, seed=seed, report=report)
    counts = log_model(model, accelerator, report)
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
    keep_model_files_in_checkpoints(accelerator, inputs.tokenizer)
    # The script's arithmetic, counted after `prepare` shards the batches; a prepared scheduler steps
    # once per process per update, hence the factors (as in the script).
    schedule = spec_schedule(spec, len(train_dataloader))
    lr_scheduler = accelerator.prepare(
        get_scheduler(
            name=spec.lr_scheduler_type,
            optimizer=optimizer,
            num_warmup_steps=schedule.warmup_steps * accelerator.num_processes,
            num_training_steps=schedule.max_train_steps * accelerator.num_processes,
        )
    )
    progress = Progress(schedule.steps_per_epoch, ranking=inputs.ranking, greater=spec.greater_is_better)
    saved = RunCheckpoints(
        accelerator,
        job.storage,
        progress,
        report,
        keep=spec.save_total_limit,
        check_room=partial(check_room, job.settings),
    )
    return _Run(
        spec=spec,
        accelerator=accelerator,
        model=model,
        evaluations={
            split: (loader, eval_orders[split])
            for split, loader in zip(eval_dataloaders, prepared_evals, strict=True)
        },
        plan=inputs.plan,
        progress=progress,
        meter=Meter(accelerator),
        report=report,
        train_dataloader=train_dataloader,
        length_sampler=length_sampler,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        schedule=schedule,
        saved=saved,
        masks=masks,
        parameter_counts=counts,
    )


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
    if spec.freeze_word_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    if not spec.apply_lora:
        return model
    return apply_lora(
        model,
        r=spec.lora_r,
        alpha=spec.lora_alpha,
        dropout=spec.lora_dropout,
        target_modules=spec.lora_target_modules,
    )


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def _train_epoch(run: _Run, batches: Any, stop_requested: Callable[[], bool]) -> bool:
    """One pass over the training batches, then the epoch's evaluation and save; whether training
    is over (max steps or early stopping)."""
    accelerator, progress, spec = run.accelerator, run.progress, run.spec
    run.model.train()
    window = LossWindow(torch.zeros((), device=accelerator.device))
    done = False
    with run.meter.training():
        for batch in batches:
            loss, grad_norm = train_step(run, batch, spec.max_grad_norm or None)  # Trainer: 0 = no clipping
            window.add(loss, grad_norm)
            run.meter.count(batch)
            if not accelerator.sync_gradients:
                continue
            progress.completed_steps += 1
            step = progress.completed_steps
            run.saved.uploads.poll()  # declares the checkpoint uploading beside these steps once it is in
            done = step >= run.schedule.max_train_steps
            if step % spec.logging_steps == 0 or done:
                _log_training(run, window)
            with run.meter.paused():
                done = _evaluate_and_save(run, at_epoch_end=False) or done
            if done:
                break
            if _stop_agreed(accelerator, stop_requested):
                run.saved.save({})
                run.saved.uploads.wait()  # a drain declares its checkpoint before the process exits
                raise Preempted(step, run.saved.path(step))
    if window.batches:  # an epoch that ended between two logging steps
        _log_training(run, window)
    if not progress.stopped_early:
        done = _evaluate_and_save(run, at_epoch_end=True) or done
    return done


def train_step(
    run: _Run, batch: dict[str, torch.Tensor], max_grad_norm: float | None
) -> tuple[Any, torch.Tensor | None]:
    """Forward, backward and (once the accumulated batches are in) the optimizer step; the loss,
    and the gradients' norm before clipping when this step clipped them."""
    accelerator = run.accelerator
    grad_norm = None
    if run.masks is not None:
        run.masks.at_step(run.progress.completed_steps)
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


def _evaluate_and_save(run: _Run, *, at_epoch_end: bool) -> bool:
    """Evaluate and save when the spec's strategies say so (at this step, or at the epoch's end);
    whether early stopping ends the training."""
    spec, step = run.spec, run.progress.completed_steps
    if at_epoch_end:
        evaluates, saves = spec.eval_strategy == "epoch", spec.save_strategy == "epoch"
    else:
        evaluates = (
            spec.eval_strategy == "steps" and bool(spec.eval_steps) and step % (spec.eval_steps or 1) == 0
        )
        saves = spec.save_strategy == "steps" and bool(spec.save_steps) and step % (spec.save_steps or 1) == 0
    metrics = _evaluate_all(run, threshold=spec.early_stopping_threshold) if evaluates else {}
    if saves:
        run.saved.save(metrics)
    return bool(metrics) and _stops_early(run)


def _stops_early(run: _Run) -> bool:
    progress, patience = run.progress, run.spec.early_stopping_patience
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


def _log_training(run: _Run, window: LossWindow) -> None:
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


def _evaluate_all(
    run: _Evaluator, *, threshold: float = 0.0, stop: Callable[[], bool] | None = None
) -> dict[str, float]:
    """Evaluate every split (MNLI: matched and mismatched); the `eval` split's metrics. `stop`: asked
    between batches (a job that does not train), Preempted once it says yes."""
    progress = run.progress
    main: dict[str, float] = {}
    runtimes: dict[str, float] = {}
    for split, (dataloader, order) in run.evaluations.items():
        started = time.perf_counter()
        metrics = evaluate(run.model, dataloader, run.accelerator, run.plan, order=order, stop=stop)
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
    stop: Callable[[], bool] | None = None,
) -> dict[str, float]:
    """The plan's metrics and the loss over a whole split, gathered from every process; `order`:
    the dataloader serves the split's rows in this order (sorted evaluation), put back before the
    metrics so that they are computed exactly as on unsorted batches."""
    model.eval()
    all_logits, all_labels = [], []
    with torch.no_grad():
        for batch in dataloader:
            if stop is not None and stop():
                raise Preempted(0, None)
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


# ---------------------------------------------------------------------------------------------------
# Outputs: the final model, predictions, the summary (outputs.py)
# ---------------------------------------------------------------------------------------------------


def _save_outputs(job: _Job, inputs: _Inputs, run: _Run) -> dict[str, Any]:
    """The final model and the predictions saved, every checkpoint declared; the run's summary."""
    out = _model_outputs(job, inputs, run.model)
    final_metrics = outputs.final_model(out, progress=run.progress, saved=run.saved)
    outputs.write_predictions(out, settings=job.settings, raw=inputs.raw, data=inputs.data)
    run.saved.uploads.wait()  # the run ends once every checkpoint it saved is uploaded and declared
    return outputs.summary(
        out,
        progress=run.progress,
        meter=run.meter,
        final_metrics=final_metrics,
        parameter_counts=run.parameter_counts,
        peak_flops=job.settings.peak_flops,
        tokenized_from_cache=inputs.data.cache_hit,
    )


def _model_outputs(job: _Job, inputs: _Inputs, model: Any) -> outputs.ModelOutputs:
    return outputs.ModelOutputs(
        accelerator=job.accelerator,
        model=model,
        tokenizer=inputs.tokenizer,
        spec=job.spec,
        report=job.report,
        storage=job.storage,
    )


# ---------------------------------------------------------------------------------------------------
# A job that does not train (do_train false)
# ---------------------------------------------------------------------------------------------------


def _without_training(job: _Job, inputs: _Inputs) -> dict[str, Any]:
    """An evaluation or prediction job: the model as loaded, evaluated once (do_eval) and/or predicting
    (do_predict, test_file); no optimizer, no step, no checkpoint, no model saved (it is the one loaded).
    A stop request (the worker shutting down) is honoured between two evaluation batches (Preempted,
    no checkpoint); a cancel stops the process at once (SIGINT), as for any job.

    The evaluation's rows are numbered step 0, epoch 0: the weights have had no optimizer step in this
    job, as Trainer numbers an evaluation before training."""
    spec, accelerator, report = job.spec, job.accelerator, job.report
    model = _build_model(inputs.model_source, spec, inputs.raw, inputs.num_labels)
    counts = log_model(model, accelerator, report)
    evaluator = _prepare_evaluation(job, inputs, model)
    what = " and ".join(
        w for w, asked in (("evaluating", spec.do_eval), ("predicting", spec.do_predict)) if asked
    )
    report.log(
        f"no training (do_train false): {what or 'predicting test_file'} with the model as loaded, on "
        f"{accelerator.device}, mixed precision {accelerator.mixed_precision}",
        data={"job_kind": job_kind(spec)},
    )
    stop = functools.partial(_stop_agreed, accelerator, job.stop_requested)
    final_metrics = _evaluate_all(evaluator, stop=stop) if spec.do_eval and evaluator.evaluations else {}
    job.storage.local.mkdir(
        parents=True, exist_ok=True
    )  # where predictions go (a training job's model made it)
    out = _model_outputs(job, inputs, evaluator.model)
    if spec.save_merged_model:  # a LoRA job's adapter, merged into its base as this job loaded it
        outputs.save_merged_source(out)
    started = time.perf_counter()
    outputs.write_predictions(out, settings=job.settings, raw=inputs.raw, data=inputs.data)
    return outputs.evaluation_summary(
        accelerator,
        final_metrics=final_metrics,
        parameter_counts=counts,
        eval_runtime_s=evaluator.meter.eval_seconds,
        predict_runtime_s=time.perf_counter() - started,
        eval_rows={split: len(rows) for split, rows in inputs.data.evals.items()},
        tokenized_from_cache=inputs.data.cache_hit,
    )


def _prepare_evaluation(job: _Job, inputs: _Inputs, model: Any) -> _Evaluator:
    """The model as loaded and the evaluation splits' loaders, prepared; the model in eval mode."""
    spec, accelerator = job.spec, job.accelerator
    collate = collator(
        inputs.tokenizer,
        pad_to_max_length=spec.pad_to_max_length,
        pad_to_multiple_of=pad_multiple(accelerator),
    )
    loaders, orders = eval_dataloaders(
        inputs.data,
        collate,
        group_eval_by_length=spec.group_eval_by_length,
        eval_batch_size=spec.per_device_eval_batch_size,
    )
    # prepare() hands one object back bare, several as a tuple (a prediction job has no loader here).
    model, *prepared = (
        accelerator.prepare(model, *loaders.values()) if loaders else (accelerator.prepare(model),)
    )
    model.eval()
    return _Evaluator(
        spec=spec,
        accelerator=accelerator,
        model=model,
        evaluations={split: (loader, orders[split]) for split, loader in zip(loaders, prepared, strict=True)},
        plan=inputs.plan,
        progress=Progress(1, ranking=inputs.ranking, greater=spec.greater_is_better),
        meter=Meter(accelerator),
        report=job.report,
    )
