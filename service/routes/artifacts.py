"""A job's folder over HTTP: its logs (a failed job's traceback without a shell on the worker) and
its artifacts (final model, checkpoints, predictions). Owner only: JobDep answers 404 for others.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import FileResponse, PlainTextResponse, Response, StreamingResponse

from service.deps import JobDep, SettingsDep
from service.job_files import confined, list_artifacts, read_log, tar_stream
from service.schemas import ArtifactList, ArtifactPublic
from shared.errors import NotFound, quote

router = APIRouter(prefix="/jobs", tags=["jobs"])

ATTEMPT_HEADER = "X-Gluejobs-Attempt"
LOG_OFFSET_HEADER = "X-Gluejobs-Log-Offset"


@router.get(
    "/{job_id}/logs",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}, "description": "The log text"}},
)
def read_job_logs(
    job: JobDep,
    settings: SettingsDep,
    attempt: Annotated[int | None, Query(ge=1, description="Which attempt (default: the newest)")] = None,
    tail: Annotated[int | None, Query(ge=0, le=100_000, description="Only the last N lines")] = None,
) -> Response:
    """The job's log: what its training process printed, tracebacks included, one file per attempt.

    Empty (200) before the job's first attempt has started; the attempt served is in the
    `X-Gluejobs-Attempt` header, and the byte offset in its log where the text ends in
    `X-Gluejobs-Log-Offset`. Follow a running job's log with `/stream?logs=true` (from there on: see
    the stream's Last-Event-ID).
    """
    served, text, end = read_log(settings.job_dir(job.id), job_id=job.id, attempt=attempt, tail=tail)
    headers = {ATTEMPT_HEADER: str(served), LOG_OFFSET_HEADER: str(end)} if served is not None else {}
    return Response(text, media_type="text/plain; charset=utf-8", headers=headers)


@router.get("/{job_id}/artifacts", response_model=ArtifactList)
def read_job_artifacts(job: JobDep, settings: SettingsDep) -> ArtifactList:
    """The files in the job's folder: `model` (the final model or adapter, and tokenizer), `checkpoint`
    (under checkpoints/checkpoint-<step>/), `predictions` (.tsv), `log`, `other`."""
    files = list_artifacts(settings.job_dir(job.id))
    return ArtifactList(data=[ArtifactPublic.model_validate(f, from_attributes=True) for f in files])


@router.get(
    "/{job_id}/artifacts/{path:path}",
    response_class=Response,
    responses={
        200: {
            "description": "The file's bytes (JSON files as application/json); a folder as a tar stream",
            "content": {"application/octet-stream": {}, "application/x-tar": {}, "application/json": {}},
        },
    },
)
def read_job_artifact(
    job: JobDep,
    settings: SettingsDep,
    path: Annotated[
        str, Path(description="A path from the listing, or a folder (e.g. checkpoints/checkpoint-8)")
    ],
) -> Response:
    """One file, streamed; a folder as an uncompressed tar stream. Paths that leave the job's folder
    (`..`, absolute paths, links that point out) are refused with 422."""
    root = settings.job_dir(job.id)
    target = confined(root, path)
    try:
        is_dir, is_file = target.is_dir(), target.is_file()
    except OSError:  # unreadable (permissions …): as good as absent, to the caller
        is_dir = is_file = False
    if is_dir:
        return StreamingResponse(
            tar_stream(root, target),
            media_type="application/x-tar",
            headers={"Content-Disposition": f'attachment; filename="{target.name or job.id}.tar"'},
        )
    if not is_file:
        raise NotFound(f"job {job.id} has no artifact {quote(path)}", field="path")
    media_type = "application/json" if target.suffix == ".json" else None
    return FileResponse(target, media_type=media_type, filename=None if media_type else target.name)
