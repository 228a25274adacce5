"""A job's folder over HTTP: its logs (a failed job's traceback without a shell on the worker) and
its artifacts (final model, checkpoints, predictions). Owner only: JobDep answers 404 for others.

They come from the store (shared/core/storage.py): the local folder the workers write, or the object
store they upload to, so the API can run on a machine that never saw a worker's disk.
"""

from __future__ import annotations

import io
import logging
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import FileResponse, PlainTextResponse, Response, StreamingResponse

from service.deps import JobDep, JobId, PrincipalDep, SessionDep, SettingsDep, StoreDep
from service.files.downloads import folder_of, stored_download
from service.files.job_folders import LocalFolder, Member, kind_of, read_log, tar_stream
from service.schemas.artifacts import ArtifactList, ArtifactPublic
from service.schemas.common import ErrorResponse
from service.schemas.storage import CheckpointsRemoved
from service.user_views import log_for_user
from shared.core.config import Settings
from shared.core.errors import NotFound, quote
from shared.core.storage import StoreUnavailable, job_key
from shared.core.tables import Job
from shared.jobs_repo.storage_usage import finish_deletions, remove_checkpoints

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/jobs", tags=["jobs"])

# `keep`: checkpoint names, comma-separated (or nothing: keep none); at most about 900 of them.
KEEP_PATTERN = r"^(checkpoint-[0-9]{1,10}(,checkpoint-[0-9]{1,10})*)?$"
KEEP_MAX_CHARS = 12_000

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
    store: StoreDep,
    principal: PrincipalDep,
    attempt: Annotated[int | None, Query(ge=1, description="Which attempt (default: the newest)")] = None,
    tail: Annotated[int | None, Query(ge=0, le=100_000, description="Only the last N lines")] = None,
) -> Response:
    """The job's log: what its training process printed, one file per attempt.

    An admin key reads the file as written, tracebacks included. Any other key reads it without
    traceback blocks (each exception's last line, its cause, stays) and with the machines' places
    named as the job's messages name them: a data file by its path in the spec, an object of the
    store by its key, any other path on a worker by its last part (service/user_views.py).

    Empty (200) before the job's first attempt has started; the attempt served is in the
    `X-Gluejobs-Attempt` header, and the byte offset in its log where the text ends in
    `X-Gluejobs-Log-Offset`. Follow a running job's log with `/stream?logs=true` (from there on: see
    the stream's Last-Event-ID).
    """
    folder = folder_of(settings, store, job.id)
    served, text, end = read_log(folder, job_id=job.id, attempt=attempt, tail=tail)
    if not principal.is_admin:
        # The offset header still counts the file's bytes: a stream resumes in the file, not the text.
        text = log_for_user(settings, job, text.decode("utf-8", errors="replace")).encode()
    headers = {ATTEMPT_HEADER: str(served), LOG_OFFSET_HEADER: str(end)} if served is not None else {}
    return Response(text, media_type="text/plain; charset=utf-8", headers=headers)


@router.get("/{job_id}/artifacts", response_model=ArtifactList)
def read_job_artifacts(job: JobDep, settings: SettingsDep, store: StoreDep) -> ArtifactList:
    """The files in the job's folder: `model` (the final model or adapter, and tokenizer), `checkpoint`
    (under checkpoints/checkpoint-<step>/), `predictions` (.tsv), `log`, `other`."""
    files = folder_of(settings, store, job.id).artifacts()
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
    store: StoreDep,
    principal: PrincipalDep,
    path: Annotated[
        str, Path(description="A path from the listing, or a folder (e.g. checkpoints/checkpoint-8)")
    ],
) -> Response:
    """One file, streamed; a folder as an uncompressed tar stream. Paths that leave the job's folder
    (`..`, absolute paths, links that point out) are refused with 422. With an S3 store and
    GLUEJOBS_STORAGE_PRESIGN_S set, a file answers 307 with a short-lived presigned URL of it.
    A log file (logs/attempt-<n>.log) reads as GET /logs serves it to the same key."""
    folder = folder_of(settings, store, job.id)
    kind = folder.kind(path)
    if kind == "dir":
        members = folder.members(path)
        if not principal.is_admin:
            members = (_for_user(settings, job, path, member) for member in members)
        return StreamingResponse(
            tar_stream(members),
            media_type="application/x-tar",
            headers={
                "Content-Disposition": f'attachment; filename="{PurePosixPath(path).name or job.id}.tar"'
            },
        )
    if kind is None:
        raise NotFound(f"job {job.id} has no artifact {quote(path)}", field="path")
    name = PurePosixPath(path).name
    if not principal.is_admin and _is_log(path):
        text = folder.read(path).decode("utf-8", errors="replace")  # one retried request
        return Response(log_for_user(settings, job, text), media_type="text/plain; charset=utf-8")
    if isinstance(folder, LocalFolder):
        target = folder.path(path)
        media_type = "application/json" if target.suffix == ".json" else None
        return FileResponse(target, media_type=media_type, filename=None if media_type else target.name)
    if name.endswith(".json") and not settings.storage_presign_s:
        # JSON files as JSON, as from the local folder; read in one retried request.
        return Response(folder.read(path), media_type="application/json")
    return stored_download(store, settings, job_key(job.id, PurePosixPath(path).as_posix()), name)


def _is_log(relative: str) -> bool:
    parts = PurePosixPath(relative).parts
    return bool(parts) and kind_of(PurePosixPath(*parts)) == "log"


def _for_user(settings: Settings, job: Job, folder: str, member: Member) -> Member:
    """A tar member as a non-admin reads it: a log file as GET /logs serves it (read whole: a tar
    header states the size before the bytes), any other file as it is."""
    inside = member.name.split("/", 1)[-1]  # the archive's names start with the folder's own name
    relative = f"{folder.strip('/')}/{inside}" if folder.strip("/") else inside
    if not _is_log(relative):
        return member
    with member.open() as handle:
        text = log_for_user(settings, job, handle.read().decode("utf-8", errors="replace")).encode()
    return replace(member, size=len(text), open=lambda: io.BytesIO(text))


@router.delete(
    "/{job_id}/checkpoints",
    response_model=CheckpointsRemoved,
    responses={409: {"model": ErrorResponse, "description": "The job is queued or running"}},
)
def delete_job_checkpoints(
    job_id: JobId,
    session: SessionDep,
    store: StoreDep,
    principal: PrincipalDep,
    keep: Annotated[
        str | None,
        Query(
            max_length=KEEP_MAX_CHARS,
            pattern=KEEP_PATTERN,
            description="The checkpoints to keep, comma-separated (checkpoint-300,checkpoint-600); "
            "empty keeps none. Left out: the best checkpoint and, for a job that did not succeed, "
            "its newest",
        ),
    ] = None,
) -> CheckpointsRemoved:
    """Remove a finished job's checkpoints, to free the owner's storage. Its final model, predictions
    and logs stay; so do the checkpoints `keep` names, or (without `keep`) its best checkpoint and,
    when the job did not succeed (no final model), its newest one.

    409 while the job is queued or running; 422 for a `keep` name the job has no checkpoint of. The
    rows go first, then the store's folders: a checkpoint is listed whole or not at all, and a folder
    whose removal a crash cut short is removed by the API's storage sweep. A job that started from
    one of them (`job:N/checkpoint-M`) has its own copy and is not affected."""
    names = None if keep is None else [name for name in keep.split(",") if name]
    actor = principal.owner or principal.key_label
    pruned = remove_checkpoints(session, job_id=job_id, owner=principal.owner_filter, keep=names, actor=actor)
    try:
        finish_deletions(session, store, pruned.journal)
    except (StoreUnavailable, OSError) as exc:  # the rows are gone; the storage sweep removes the rest
        logger.warning(
            "job %s: checkpoint folders left to the storage sweep (%s)", job_id, type(exc).__name__
        )
    return CheckpointsRemoved(
        job_id=pruned.job_id, removed=pruned.removed, kept=pruned.kept, freed_bytes=pruned.freed_bytes
    )
