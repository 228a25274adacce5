"""Jobs for people: the columns of `gluejobs ls`, the summary of `gluejobs show`, a rerun's comparison,
and the plan `gluejobs submit --dry-run` prints."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gluejobs.cli.output import aligned, text, when
from gluejobs.client import Checkpoint, Job
from shared.jobspec.spec import job_kind

LS_COLUMNS = ("id", "status", "kind", "task", "model", "metric", "progress", "duration", "created")
# What `gluejobs show` says a job does (shared/jobspec/spec.py's job_kind decides which).
KIND_WORDS = {
    "train": "train: fine-tunes the model",
    "eval": "eval: evaluates the model as loaded, no training (do_train false)",
    "predict": "predict: predictions of the model as loaded, no training (do_train false)",
}
LS_RIGHT = frozenset({"id", "metric"})


def ls_row(job: Job) -> list[str]:
    return [
        str(job.id),
        # A queued job held back says by what (`gluejobs show` gives the whole message).
        f"{job.status} ({job.waiting_for.get('reason')})" if job.waiting_for else job.status,
        kind(job),
        task(job),
        str(job.spec.get("model_name_or_path", "")),
        headline(job),
        progress(job),
        duration(job),
        when(job.created_at),
    ]


def waiting(reason: dict[str, str]) -> str:
    """A queued job's waiting_for, as one phrase: "quota: alice holds 1 of 1 devices (max_devices)"."""
    return f"{reason.get('reason')}: {reason.get('message')}"


def summary(job: Job, checkpoints: list[Checkpoint]) -> list[str]:
    """`gluejobs show`: what the job is and did, then its spec, each block's values in one column."""
    head: list[tuple[str, Any]] = [
        ("kind", KIND_WORDS[kind(job)]),
        ("task", task(job)),
        ("model", job.spec.get("model_name_or_path")),
        ("created", when(job.created_at)),
        ("duration", duration(job) or "-"),
        ("progress", progress(job) or "-"),
    ]
    if job.worker_id:
        head.append(("worker", f"{job.worker_id} (attempt {job.attempts})"))
    if job.sweep_id is not None:
        head.append(("sweep", f"{job.sweep_id} ({job.metadata.get('sweep_configuration', '')})"))
    if job.rerun_of is not None:
        head.append(("rerun of", f"job {job.rerun_of}: {reproduction(job.reproduction)}"))
    params = parameters(job.result or {})
    if params:
        head.append(("parameters", params))
    if job.headline_metric:
        head.append(("headline", headline_detail(job.headline_metric)))
    for split, values in sorted(job.latest_metrics.items()):
        shown = ", ".join(f"{k} {v:.4g}" for k, v in values.items() if k not in ("step", "epoch"))
        head.append((split, f"{shown} (step {values.get('step')})"))
    if job.best_metrics:
        best = job.best_metrics
        head.append(("best", f"{best['metric']} {best['value']:.4f} at step {best['step']}"))
    for checkpoint in checkpoints:
        mark = " (best)" if checkpoint.is_best else ""
        # The command that fetches it: what a reader can run (an admin key's rows carry the worker's
        # place in `path`, which means nothing on this machine).
        fetch = f"gluejobs download {job.id} DIR --checkpoint {checkpoint.step}"
        head.append(("checkpoint", f"step {checkpoint.step}, epoch {checkpoint.epoch:g}{mark}: {fetch}"))
    if job.output_dir:
        head.append(("output", f"/v1/jobs/{job.id}/artifacts (gluejobs download {job.id} DIR)"))
    if job.error:
        head.append(("error", f"{job.error_code or 'failed'}: {job.error.splitlines()[0]}"))
    head += [("warning", warning) for warning in job.warnings]
    if job.waiting_for:
        head.append(("waiting for", waiting(job.waiting_for)))
    lines = [f"job {job.id}: {job.status} (attempt {job.attempts} of {job.max_attempts})"]
    lines += aligned(head)
    lines.append("spec")
    lines += aligned(job.spec.items())
    return lines


def parameters(result: dict[str, Any]) -> str:
    """Trainable of total parameters, and the LoRA matrices' share."""
    trainable, total = result.get("trainable_params"), result.get("total_params")
    if trainable is None or total is None:
        return ""
    lora = result.get("lora_params")
    share = f" ({result['trainable_percent']}%)" if result.get("trainable_percent") is not None else ""
    return f"{trainable:,} trainable of {total:,}{share}" + (f", LoRA {lora:,}" if lora else "")


def headline_detail(metric: dict[str, Any]) -> str:
    newest = "-" if metric.get("value") is None else f"{metric['value']:.4f}"
    best = "" if metric.get("best") is None else f" (best {metric['best']:.4f})"
    return f"{metric['name']} {newest}{best}"


def reproduction(result: dict[str, Any] | None) -> str:
    """A rerun's comparison with its original, in a line."""
    if not result:
        return "not compared"
    status = result.get("status")
    if status == "pending":
        return "pending (compared once both have finished)"
    if status == "not_comparable":
        return f"not comparable: {result.get('reason')}"
    largest = result.get("max_abs_difference")
    gap = f", largest difference {largest:.3g}" if largest else ""
    return f"{status} ({result.get('match') or 'metrics differ'}{gap}, {result.get('compared')} values)"


def reproduction_lines(result: dict[str, Any] | None) -> list[str]:
    """`gluejobs rerun --watch`: the comparison, then what differs."""
    lines = [f"reproduction: {reproduction(result)}"]
    for item in (result or {}).get("differences", [])[:20]:
        lines.append(
            f"  {item['evaluation']} {item['split']} {item['name']}: {text(item['original'])} → "
            f"{text(item['rerun'])}"
        )
    lines += [f"  environment: {line}" for line in (result or {}).get("environment_differences") or []]
    return lines


def kind(job: Job) -> str:
    """train, eval or predict: what the job does."""
    return job_kind(job.spec)


def task(job: Job) -> str:
    return str(job.spec.get("task_name") or job.spec.get("train_file") or "")


def headline(job: Job) -> str:
    metric = job.headline_metric or {}
    value = metric.get("best") if metric.get("best") is not None else metric.get("value")
    return f"{metric['name']} {value:.4f}" if value is not None else ""


def progress(job: Job) -> str:
    if kind(job) != "train":  # no steps to count: whether its one evaluation is in
        return "evaluated" if job.latest_metrics.get("eval") else ""
    train = job.latest_metrics.get("train") or {}
    step = train.get("step")
    if step is None:
        return ""
    total = (job.result or {}).get("completed_steps") or job.spec.get("max_train_steps")
    return f"step {step}{f'/{total}' if total else ''} · epoch {train.get('epoch', 0):.2f}"


def duration(job: Job) -> str:
    if job.started_at is None:
        return ""
    seconds = int(((job.finished_at or datetime.now(UTC)) - job.started_at).total_seconds())
    return (
        f"{seconds // 3600}h{seconds // 60 % 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """`gluejobs submit --dry-run`: the API's plan (data, schedule, tokens, memory), a line each."""
    spec = plan["spec"]
    source = spec.get("task_name") or spec.get("train_file")
    lines = [f"plan for {source} on {spec['model_name_or_path']} (seed {spec['seed']}); nothing was stored"]
    lines += [f"  warning: {w}" for w in plan["warnings"]]  # at the top, where they are read
    for name, split in plan["data"]["splits"].items():
        labels = split.get("label_counts") or split.get("score_range") or {}
        shown = ", ".join(f"{k} {v}" for k, v in labels.items())
        lines.append(
            f"  data {name:<15} {split['where']}: {split['rows']} rows, {split['rows_used']} used"
            + (f"; {shown}" if shown else "")
        )
    for name, split in plan["data"]["predict"].items():
        lines.append(f"  predict {name:<12} {split['where']}: {split['rows']} rows")
    for item in plan["data"]["unread"]:
        lines.append(f"  not read here     {item} (the worker reads it)")
    lines.append("  " + _schedule_line(plan["schedule"], spec))
    lines.append("  " + _tokens_line(plan["tokens"]))
    lines.append("  " + _memory_line(plan["memory"]))
    return lines


def _schedule_line(schedule: dict[str, Any], spec: dict[str, Any]) -> str:
    if schedule["status"] != "known":
        return f"schedule: unknown ({schedule['reason']})"
    if schedule.get("kind", "train") != "train":
        batches = ", ".join(f"{name} {n}" for name, n in schedule["eval_batches"].items())
        predicted = schedule.get("predicted_rows")
        return (
            f"schedule: no training ({schedule['kind']}): 0 optimizer steps, {schedule['evaluations']} "
            "evaluation"
            + ("" if schedule["evaluations"] == 1 else "s")
            + (" at step 0" if schedule["evaluations"] else "")
            + (f" ({batches} batches)" if batches else "")
            + (f", {predicted} rows predicted" if predicted is not None else "")
            + ", 0 checkpoints"
        )
    steps = ", ".join(map(str, schedule["evaluation_steps"]))
    # The epochs asked for (2.5), unless max_train_steps decides: then the epochs the steps span.
    epochs = (
        schedule["epochs"]
        if spec.get("max_train_steps")
        else spec.get("num_train_epochs", schedule["epochs"])
    )
    return (
        f"schedule: {schedule['steps_per_epoch']} steps/epoch × {epochs} epochs = "
        f"{schedule['total_optimizer_steps']} optimizer steps ({schedule['samples_per_optimizer_step']} "
        f"samples each), warmup {schedule['warmup_steps']}, {schedule['evaluations']} evaluations"
        + (f" at steps {steps}" if steps else "")
        + f", {schedule['checkpoints']} checkpoints"
    )


def _tokens_line(tokens: dict[str, Any]) -> str:
    if tokens["status"] != "measured":
        return f"tokens: unknown ({tokens['reason']})"
    if "train" not in tokens:  # a job that does not train: its evaluation rows
        rows = tokens.get("eval") or {}
        return (
            f"tokens: eval longest {rows.get('longest')}, mean {rows.get('mean')} ({rows.get('sample')}, "
            f"{rows.get('truncated_rows')} truncated)"
        )
    train = tokens["train"]
    padding = train["padding"]
    schemes = ", ".join(
        f"{name} {padding[name]['padding_percent']}%"
        for name in ("dynamic", "group_by_length", "pad_to_max_length")
    )
    return (
        f"tokens: train longest {train['longest']}, mean {train['mean']} ({train['sample']}, "
        f"{train['truncated_rows']} truncated); padding {schemes} (this job: {padding['used']})"
    )


def _memory_line(memory: dict[str, Any]) -> str:
    if memory["status"] != "estimated":
        return f"memory: unknown ({memory['reason']})"
    return (
        f"memory: ~{memory['total_gib']} GiB per process ({memory['precision']}, batch {memory['batch']} × "
        f"{memory['sequence_length']} tokens, {memory['trainable_parameters']:,} trainable of "
        f"{memory['parameters']:,} parameters)"
    )
