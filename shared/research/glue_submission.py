"""GLUE's submission format: the files a task's predictions go in, and the zip GLUE's site accepts.

Torch-free: the worker writes the files (worker/training/glue_predictions.py), the API bundles them
(GET /v1/submissions). One file per test split, named as GLUE expects (CoLA.tsv … MNLI-m.tsv,
MNLI-mm.tsv, AX.tsv), a header `index<TAB>prediction`, the test file's own ids in its order, and
the task's label format: 0/1 ids, label names (MNLI, QNLI, RTE) or STS-B scores clipped to 0..5.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.core.errors import InvalidRequest
from shared.jobspec.tasks import DIAGNOSTIC_SUBMISSION_FILE, GLUE_SUBMISSIONS, SUBMISSION_HEADER, TASKS

STSB_RANGE = (0.0, 5.0)
MNLI = "mnli"


def prediction_labels(task_name: str, predictions: Sequence[float]) -> list[str]:
    """Predictions (label ids, or scores for STS-B) written the way GLUE's site reads them."""
    task = TASKS[task_name]
    label_format = GLUE_SUBMISSIONS[task_name].label_format
    if label_format == "score":
        low, high = STSB_RANGE
        # GLUE scores STS-B against 0..5 ratings; a regression head can overshoot either end.
        return [f"{min(max(float(value), low), high):.3f}" for value in predictions]
    ids = [int(value) for value in predictions]
    if label_format == "id":
        return [str(i) for i in ids]
    assert task.label_names is not None
    return [task.label_names[i] for i in ids]


def write_submission_file(path: Path, ids: Sequence[str], labels: Sequence[str]) -> None:
    if len(ids) != len(labels):
        raise ValueError(f"{len(ids)} ids but {len(labels)} predictions for {path.name}")
    lines = ["\t".join(SUBMISSION_HEADER), *(f"{i}\t{label}" for i, label in zip(ids, labels, strict=True))]
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
    partial.replace(path)  # a reader (the bundler) never sees half a file


def task_submission_files(task_name: str) -> tuple[str, ...]:
    """The files a job on this task writes with do_predict (AX.tsv only when the data had it)."""
    return tuple(name for _, name in GLUE_SUBMISSIONS[task_name].files)


# Every file of a complete GLUE submission, and the task each comes from.
ALL_SUBMISSION_FILES: dict[str, str] = {
    **{name: task for task in GLUE_SUBMISSIONS for name in task_submission_files(task)},
    DIAGNOSTIC_SUBMISSION_FILE: MNLI,
}


@dataclass(frozen=True)
class JobFiles:
    """What the bundler needs to know about one job."""

    job_id: int
    task_name: str | None
    status: str
    # A file of the job's folder by name: its bytes, or None when it has none (the folder may be in
    # the local store or an object store: the caller reads it).
    read: Callable[[str], bytes | None]


def bundle_submission(jobs: Sequence[JobFiles], *, allow_partial: bool = False) -> bytes:
    """The zip GLUE's site accepts: each task's files at the top level, every task exactly once.

    Refused (InvalidRequest, field "jobs"): a job without a task or without its files, a task that
    two jobs answer, and, unless allow_partial, a task (or AX.tsv) that no job answers.
    """
    if not jobs:
        raise InvalidRequest("name at least one job", field="jobs")
    by_task: dict[str, list[int]] = {}
    for job in jobs:
        if job.task_name is None:
            raise InvalidRequest(
                f"job {job.job_id} has no task_name: it has no GLUE test split", field="jobs"
            )
        by_task.setdefault(job.task_name, []).append(job.job_id)
    twice = {task: ids for task, ids in by_task.items() if len(ids) > 1}
    if twice:
        listed = "; ".join(f"{_glue_name(t)} by jobs {', '.join(map(str, ids))}" for t, ids in twice.items())
        raise InvalidRequest(f"a task is answered more than once: {listed}", field="jobs")

    files: dict[str, bytes] = {}
    for job in jobs:
        assert job.task_name is not None
        files.update(_job_files(job))
    missing = [name for name in ALL_SUBMISSION_FILES if name not in files]
    if missing and not allow_partial:
        raise InvalidRequest(
            f"the bundle misses {', '.join(_described(name) for name in missing)}; GLUE's site wants every "
            "task (pass allow_partial=true for a partial zip)",
            field="jobs",
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in ALL_SUBMISSION_FILES:
            if name in files:
                archive.writestr(name, files[name])
    return buffer.getvalue()


def _job_files(job: JobFiles) -> dict[str, bytes]:
    assert job.task_name is not None
    if job.status != "succeeded":
        raise InvalidRequest(f"job {job.job_id} has not succeeded (it is {job.status})", field="jobs")
    found: dict[str, bytes] = {}
    for name in task_submission_files(job.task_name):
        content = job.read(name)
        if content is None:
            raise InvalidRequest(
                f"job {job.job_id} ({job.task_name}) has no {name}: was it run with do_predict?", field="jobs"
            )
        found[name] = content
    if job.task_name == MNLI and (diagnostic := job.read(DIAGNOSTIC_SUBMISSION_FILE)) is not None:
        found[DIAGNOSTIC_SUBMISSION_FILE] = diagnostic
    return found


def _glue_name(task_name: str) -> str:
    return task_submission_files(task_name)[0].removesuffix(".tsv").removesuffix("-m")


def _described(file_name: str) -> str:
    task = ALL_SUBMISSION_FILES[file_name]
    if file_name == DIAGNOSTIC_SUBMISSION_FILE:
        return f"{file_name} (the diagnostic set, from an MNLI job whose data has diagnostic/diagnostic.tsv)"
    return f"{file_name} ({task})"
