"""`gluejobs watch` (and `submit --watch`, `gluejobs demo`): a job followed through its live stream,
as a progress bar over optimizer steps and a line per evaluation."""

from __future__ import annotations

from typing import Any

from gluejobs.client import Client, Job, Metric


def watch_job(client: Client, job_id: int) -> int:
    """Follow a job until it ends; 0 when it succeeds, 1 otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(highlight=False, soft_wrap=True)
    progress = Progress(
        TextColumn("job {task.fields[job]} {task.fields[status]}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    evaluations: dict[tuple[str, int], list[Metric]] = {}
    final = "unknown"
    with progress:
        bar = progress.add_task("train", total=None, job=job_id, status="", rate="")
        for message in client.jobs.stream(job_id):
            if message.event != "metric" or message.data.get("split") == "train":
                _print_evaluations(progress.console, evaluations)
            if message.event == "status":
                progress.update(bar, status=message.data["status"])
                progress.console.print(f"job {job_id}: {message.data['message']}")
            elif message.event == "event" and isinstance(message.data.get("data"), dict):
                steps = message.data["data"].get("max_train_steps")
                if steps:
                    progress.update(bar, total=int(steps))
            elif message.event == "metric":
                row = Metric.from_json(message.data)
                if row.split == "train":
                    progress.update(bar, completed=row.step)
                    speed = progress.tasks[0].speed
                    progress.update(bar, rate=f"{speed:.2f} steps/s" if speed else "")
                else:
                    evaluations.setdefault((row.split, row.step), []).append(row)
            elif message.event == "end":
                final = message.data["status"]
        _print_evaluations(progress.console, evaluations)
    job = client.jobs.get(job_id)
    console.print(_final_line(job))
    return 0 if final == "succeeded" else 1


def _print_evaluations(console: Any, evaluations: dict[tuple[str, int], list[Metric]]) -> None:
    for (split, step), rows in evaluations.items():
        values = "  ".join(f"{r.name} {r.value:.4f}" for r in rows)
        console.print(f"  epoch {rows[0].epoch:>5.2f}  step {step:>6}  {split:<15} {values}")
    evaluations.clear()


def _final_line(job: Job) -> str:
    if job.status == "succeeded":
        speed = (job.result or {}).get("train_samples_per_second")
        tail = f", {speed:.1f} train samples/s" if speed else ""
        return f"job {job.id} succeeded{tail}; download the model: gluejobs download {job.id} DIR"
    if job.status == "failed":
        return f"job {job.id} failed: {job.error}\n  (its log: gluejobs logs {job.id})"
    return f"job {job.id} {job.status}"
