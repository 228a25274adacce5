"""Uploaded files (the API's /v1/files routes), and the link of a job to the files its spec names.

A file's bytes live in the store under their sha256 (shared/core/storage.py); a row here describes one
upload of them by one owner. A job names a file in its spec (`train_file: "file-7"`, with the file's
record under `uploaded_files`); `link_files` records that use inside the job's own transaction,
locking the file's row, and `delete_file` refuses (409) while a queued or running job holds one:
the two are serialised by that lock, so a file cannot vanish under a job being created.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.errors import Conflict, NotFound
from shared.core.ownership import _newest_first, _owned
from shared.core.tables import File, Job, JobFile, JobStatus, utcnow

FILE_ID_PREFIX = "file-"
# The statuses of a job that will still read its files.
_USING = (JobStatus.queued, JobStatus.running, JobStatus.cancelling)


def public_id(file_id: int) -> str:
    """How the API names a file: `file-7`."""
    return f"{FILE_ID_PREFIX}{file_id}"


def row_id(public: str) -> int | None:
    """The row id of a `file-7` name, or None when it is not one."""
    digits = public.removeprefix(FILE_ID_PREFIX)
    if not public.startswith(FILE_ID_PREFIX) or not (digits.isascii() and digits.isdigit()):
        return None
    if len(digits) > 18:  # beyond 64-bit row ids
        return None
    return int(digits)


@dataclass(frozen=True)
class NewFile:
    owner: str | None
    filename: str
    format: str
    purpose: str
    task_name: str | None
    bytes: int
    sha256: str
    rows: int
    columns: list[str]
    checks: dict[str, Any]


def add_file(session: Session, *, new: NewFile) -> tuple[File, bool]:
    """The owner's file with these bytes and format, or a new one: (the file, whether it is new).
    The same bytes sent twice by one owner are one file."""
    with write(session):
        existing = session.scalars(
            select(File)
            .where(File.sha256 == new.sha256, File.format == new.format, _same_owner(new.owner))
            .order_by(File.id)
            .limit(1)
        ).first()
        if existing is not None:
            return existing, False
        file = File(**vars(new), created_at=utcnow())
        session.add(file)
        session.flush()
        return file, True


def recheck_file(session: Session, *, file_id: int, checks: dict[str, Any], purpose: str) -> File:
    """The owner's file with what a new check of its bytes found: the same bytes uploaded again with
    another column mapping (shared/jobspec/column_mapping.py) are tallied by their new label column."""
    with write(session):
        file = session.get(File, file_id, with_for_update=True)
        if file is None:
            raise NotFound()
        file.checks, file.purpose = checks, purpose
        session.flush()
        return file


def find_file(session: Session, *, owner: str | None, sha256: str, format: str) -> File | None:
    """The owner's own file with these bytes and format, if it has one (never another owner's)."""
    with read(session):
        return session.scalars(
            select(File)
            .where(File.sha256 == sha256, File.format == format, _same_owner(owner))
            .order_by(File.id)
            .limit(1)
        ).first()


def _same_owner(owner: str | None) -> Any:
    return File.owner.is_(None) if owner is None else File.owner == owner


def get_file(session: Session, *, file_id: int, owner: str | None = None) -> File:
    """The file, or NotFound (also for another owner's file: it does not say that it exists)."""
    with read(session):
        return _owned(session, File, file_id, owner)


def list_files(
    session: Session,
    *,
    after: int | None = None,
    limit: int = 20,
    owner: str | None = None,
    sha256: str | None = None,
) -> tuple[list[File], bool]:
    """Newest first; with `sha256`, only files with those bytes (the client's "is it there yet?")."""
    query = select(File)
    if sha256 is not None:
        query = query.where(File.sha256 == sha256)
    return _newest_first(session, query, File, after=after, limit=limit, owner=owner)


def delete_file(session: Session, *, file_id: int, owner: str | None = None) -> tuple[File, bool]:
    """Delete the file: (its row, whether no other row has its bytes, so the object may go).
    Conflict while a queued or running job uses it."""
    with write(session):
        file = _owned(session, File, file_id, owner, lock=True)
        users = list(
            session.scalars(
                select(Job.id)
                .join(JobFile, JobFile.job_id == Job.id)
                .where(JobFile.file_id == file.id, Job.status.in_(_USING))
                .order_by(Job.id)
            )
        )
        if users:
            raise Conflict(
                f"{public_id(file.id)} is used by {'job' if len(users) == 1 else 'jobs'} "
                f"{', '.join(map(str, users[:10]))}, still queued or running; delete it once they end"
            )
        session.execute(delete(JobFile).where(JobFile.file_id == file.id))
        session.delete(file)
        others = session.scalar(select(func.count()).select_from(File).where(File.sha256 == file.sha256))
    return file, not others


def link_files(session: Session, *, job: Job, uploaded: Mapping[str, Any]) -> None:
    """Record, inside the job's write transaction, which file each spec field names (`uploaded`:
    the spec's `uploaded_files`); NotFound when one has been deleted since the spec was checked."""
    for field, record in sorted(uploaded.items()):
        file_id = row_id(str(record.get("id", "")))
        file = session.get(File, file_id, with_for_update=True) if file_id is not None else None
        if file is None or file.sha256 != record.get("sha256"):
            raise NotFound(f"{record.get('id')!s} no longer exists", field=f"spec.{field}")
        session.add(JobFile(job_id=job.id, field=field, file_id=file.id))
