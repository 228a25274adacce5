"""/v1/files: data files uploaded through the API, checked as they land, kept in the store by content.

An upload streams to this machine's disk (service/files/uploads.py), is checked with the dry run's rules
(service/files/upload_checks.py), and only then is stored: its bytes under their sha256 in the store (once,
whoever sends them again), its description as a row owned by the caller. A refused or cut-off
upload keeps nothing. A job names a file by id wherever it takes a file name.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request, Response, status
from sqlalchemy.orm import Session

from service.accounts.owner_views import check_room
from service.deps import After, FileDep, PrincipalDep, SessionDep, SettingsDep, StoreDep
from service.files.check_runner import FileChecks
from service.files.downloads import stored_download
from service.files.stored_files import remove_unheld
from service.files.upload_checks import PURPOSES, UploadReport, task_of, upload_warnings
from service.files.upload_values import refuse_unstorable_report
from service.files.uploads import FILE_FIELD, Received, receive_upload
from service.schemas.common import ErrorResponse, Page
from service.schemas.files import FileCheck, FileDeleted, FilePublic
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.errors import InvalidRequest
from shared.core.faults import crash_point
from shared.core.storage import Store, StoreUnavailable, file_key
from shared.core.tables import File
from shared.data.local_copies import keep_copy
from shared.jobspec.column_mapping import MAX_COLUMN_NAME_CHARS, ColumnMapping
from shared.jobspec.tasks import GlueTask

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/files", tags=["files"])

# The spec's column mapping (shared/jobspec/column_mapping.py), as form fields of the upload: its check reads
# the texts and labels from these columns, and its stored tally counts the label column's values.
COLUMN_FORM_FIELDS = {
    "text_column": "The column that holds the text (as the job spec's text_column)",
    "text_pair_column": "The column that holds a sentence pair's second text",
    "label_column": "The column that holds the labels (default: label)",
}

# The body POST /v1/files takes, for the schema: the body is parsed by hand (service/files/uploads.py).
UPLOAD_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": [FILE_FIELD],
                "properties": {
                    FILE_FIELD: {
                        "type": "string",
                        "format": "binary",
                        "description": "The file: .csv, .tsv, .json, .jsonl or .parquet (by its name)",
                    },
                    "purpose": {"type": "string", "enum": list(PURPOSES), "default": "train"},
                    "task_name": {
                        "type": "string",
                        "description": "Check its labels against this GLUE task (sst2, mnli …)",
                    },
                    **{
                        name: {"type": "string", "maxLength": MAX_COLUMN_NAME_CHARS, "description": words}
                        for name, words in COLUMN_FORM_FIELDS.items()
                    },
                },
            }
        }
    },
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=FilePublic | FileCheck,
    openapi_extra={"requestBody": UPLOAD_BODY},
    responses={
        200: {
            "model": FilePublic | FileCheck,
            "description": "You had uploaded these bytes already: that file; or dry_run=true: the checks",
        },
        400: {"model": ErrorResponse, "description": "The upload was cut off; nothing was kept"},
        413: {"model": ErrorResponse, "description": "Larger than GLUEJOBS_MAX_UPLOAD_BYTES"},
        429: {
            "model": ErrorResponse,
            "description": "GLUEJOBS_MAX_FILE_CHECKS uploads are being checked, or the owner's storage "
            "quota (max_storage_bytes) has no room for the file",
        },
        503: {"model": ErrorResponse, "description": "The store or the database is unavailable"},
    },
)
async def create_file(
    request: Request,
    response: Response,
    settings: SettingsDep,
    store: StoreDep,
    session: SessionDep,
    principal: PrincipalDep,
    dry_run: Annotated[
        bool, Query(description="Check the file and keep nothing: 200 with the checks")
    ] = False,
) -> FilePublic | FileCheck:
    """Upload a data file (multipart/form-data, the part `file`; optional fields `purpose` —
    train, validation or test —, `task_name`, and the column mapping a job spec takes: `text_column`,
    `text_pair_column`, `label_column`, which the check reads the texts and labels from). It is
    streamed to disk, never held in memory, up to GLUEJOBS_MAX_UPLOAD_BYTES (413 past it), then
    checked, in a child process with memory and CPU limits (at most GLUEJOBS_MAX_FILE_CHECKS at
    once: 429 past it), as a dry run checks a job's data: its shape within GLUEJOBS_FILE_MAX_*
    (columns, bytes per cell and row, parquet row groups), format, text columns, labels (present and
    of one type; fitting `task_name`'s task when given), rows. A file that cannot serve as training
    data gets 422 naming the problem, and nothing is kept. Stored by content: the same bytes are
    stored once; the same bytes sent again by you answer 200 with the file you have (sent again with
    another column mapping, its checks are those of the new mapping). An owner whose storage quota
    (max_storage_bytes) the file would pass gets 429 (over_quota) naming what it holds and the limit.
    """
    if not dry_run:  # an owner at its storage quota is refused before a byte is read
        await anyio.to_thread.run_sync(check_room, session, settings, principal.owner, 0)
    received = await receive_upload(
        request, folder=settings.cache_dir / "uploads", max_bytes=settings.max_upload_bytes
    )
    try:
        kept = await anyio.to_thread.run_sync(
            _keep, received, request.app.state.file_checks, settings, store, session, principal.owner, dry_run
        )
    finally:
        received.path.unlink(missing_ok=True)
    if isinstance(kept, FileCheck):
        response.status_code = status.HTTP_200_OK
        return kept
    file, created = kept
    if not created:
        response.status_code = status.HTTP_200_OK
    return FilePublic.of(file)


def _keep(
    received: Received,
    checks: FileChecks,
    settings: Settings,
    store: Store,
    session: Session,
    owner: str | None,
    dry_run: bool,
) -> FileCheck | tuple[File, bool]:
    task = task_of(received.fields.get("task_name"))
    purpose = received.fields.get("purpose") or "train"
    report = checks.check(
        received.path,
        filename=received.filename,
        purpose=purpose,
        task_name=task.name if task else None,
        mapping=_column_mapping(received.fields),
    )
    refuse_unstorable_report(report)  # the same refusals on SQLite and Postgres, before anything is stored
    if dry_run:
        return FileCheck(
            filename=received.filename,
            format=report.format,
            bytes=received.bytes,
            sha256=received.sha256,
            rows=report.rows,
            columns=report.columns,
            checks=report.checks,
            warnings=[w.as_dict() for w in upload_warnings(report.checks, report.rows)],
        )
    file = jobs_repo.find_file(session, owner=owner, sha256=received.sha256, format=report.format)
    created = False
    if file is None:
        check_room(session, settings, owner, received.bytes)
        file, created = _store(received, report, store, session, owner=owner, purpose=purpose, task=task)
    elif (file.checks or {}).get("columns") != report.checks.get("columns"):
        # Sent again with another column mapping: its tally is now that of the mapping's columns.
        file = jobs_repo.recheck_file(session, file_id=file.id, checks=report.checks, purpose=purpose)
    if not store.is_local:  # this machine's copy, for the checks of the jobs that name it
        keep_copy(received.path, settings.cache_dir, sha256=received.sha256, suffix=f".{report.format}")
    return file, created


def _column_mapping(fields: dict[str, str]) -> ColumnMapping:
    """The upload's column mapping from its form fields (an empty field names no column)."""
    for name in COLUMN_FORM_FIELDS:
        value = fields.get(name)
        if value is not None and len(value) > MAX_COLUMN_NAME_CHARS:
            raise InvalidRequest(f"{name} is longer than {MAX_COLUMN_NAME_CHARS} characters", field=name)
    return ColumnMapping.of(fields)


def _store(
    received: Received,
    report: UploadReport,
    store: Store,
    session: Session,
    *,
    owner: str | None,
    purpose: str,
    task: GlueTask | None,
) -> tuple[File, bool]:
    """The bytes into the store, then the row: the file is visible only once both exist, and a failed
    row write takes the bytes out again (a crash in between leaves them to service/files/stored_files.py's
    sweep at the next start). The bytes are written whether or not another owner's file holds them
    already: the answer and the store's work are those of new bytes, so an upload cannot tell whether
    someone else has a file."""
    key = file_key(received.sha256)
    store.put(received.path, key)
    crash_point("after_store_put")  # tests: an API killed between the store and the database
    new = jobs_repo.NewFile(
        owner=owner,
        filename=received.filename,
        format=report.format,
        purpose=purpose,
        task_name=task.name if task else None,
        bytes=received.bytes,
        sha256=received.sha256,
        rows=report.rows,
        columns=report.columns,
        checks=report.checks,
    )
    try:
        file, created = jobs_repo.add_file(session, new=new)  # not created: the owner's upload at once
    except BaseException:
        try:
            remove_unheld(session, store, received.sha256)
        except Exception as exc:  # the database or the store is away: the start-up sweep removes them
            logger.warning("an upload's bytes stay in the store until the next sweep: %s", type(exc).__name__)
        raise
    if not store.exists(key):  # the last other file with these bytes was deleted meanwhile
        store.put(received.path, key)
    return file, created


@router.get("", response_model=Page[FilePublic])
def read_files(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 20,
    after: After = None,
    sha256: Annotated[
        str | None, Query(pattern=r"^[0-9a-f]{64}$", description="Only files with these bytes")
    ] = None,
) -> dict[str, Any]:
    """Your uploaded files, newest first, in cursor pages (`sha256=`: is a file there already?)."""
    files, has_more = jobs_repo.list_files(
        session, after=after, limit=limit, owner=principal.owner_filter, sha256=sha256
    )
    return {
        "data": [FilePublic.of(f) for f in files],
        "has_more": has_more,
        "next_cursor": str(files[-1].id) if has_more and files else None,
    }


@router.get("/{file_id}", response_model=FilePublic)
def read_file(file: FileDep) -> FilePublic:
    """One uploaded file."""
    return FilePublic.of(file)


@router.get(
    "/{file_id}/content",
    response_class=Response,
    responses={
        200: {"description": "The file's bytes", "content": {"application/octet-stream": {}}},
        307: {"description": "GLUEJOBS_STORAGE_PRESIGN_S set: a presigned URL of the store to read it from"},
    },
)
def read_file_content(file: FileDep, store: StoreDep, settings: SettingsDep) -> Response:
    """The bytes of an uploaded file, streamed from the store (or, with GLUEJOBS_STORAGE_PRESIGN_S
    set and an S3 store, a redirect to a short-lived presigned URL)."""
    return stored_download(store, settings, file_key(file.sha256), file.filename)


@router.delete("/{file_id}", response_model=FileDeleted, responses={409: {"model": ErrorResponse}})
def delete_file(file: FileDep, session: SessionDep, principal: PrincipalDep, store: StoreDep) -> FileDeleted:
    """Delete an uploaded file; 409 while a queued or running job uses it. Its bytes leave the store
    when no other file holds them; finished jobs keep the record of what they trained on."""
    deleted, last = jobs_repo.delete_file(session, file_id=file.id, owner=principal.owner_filter)
    if last:
        try:
            store.delete(file_key(deleted.sha256))
        except StoreUnavailable as exc:  # the row is gone; the object stays behind, unreferenced
            logger.warning(
                "%s: its bytes stay in the store: %s", jobs_repo.public_id(deleted.id), exc.message
            )
    return FileDeleted(id=jobs_repo.public_id(deleted.id))
