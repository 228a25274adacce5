"""Route dependencies as Annotated aliases, so a route's signature says what it needs.

Those that only read the app's state are `async def`: FastAPI runs a plain `def` dependency in its
thread pool, and a thread hop per dependency was most of a cursor poll's CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path as FilePath
from typing import Annotated

import anyio
from annotated_types import Ge, Le
from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.accounts.auth import KeyRing, Principal
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.errors import Conflict, NotFound
from shared.core.storage import Store
from shared.core.tables import File, Job, Search, StoredModel, Sweep
from shared.data.local_copies import local_copy
from shared.jobs_repo.model_objects import job_model
from shared.jobspec.data_scope import DataScope, data_scope
from shared.jobspec.job_sources import JobSource
from shared.jobspec.registered_models import NAME_PATTERN, RegisteredModel, reference
from shared.jobspec.suggest import did_you_mean
from shared.jobspec.upload_tally import StoredUpload
from shared.jobspec.uploaded_files import UploadedFile
from shared.searches import store as search_store


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_database(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


async def _settings(request: Request) -> Settings:
    return get_settings(request)


async def _database(request: Request) -> Database:
    return get_database(request)


def get_session(db: Annotated[Database, Depends(_database)]) -> Iterator[Session]:
    with db.session() as session:
        yield session


# Row ids are BIGINT on Postgres and INTEGER on SQLite: signed 64-bit on both. A larger number can
# name no row, and both databases fail (500) when asked to compare a column with it, so every id and
# cursor a request carries is bounded here. New routes take ids and cursors through these types:
# `Annotated[RowId, Path(description=...)]`, `After`.
MAX_ROW_ID = 2**63 - 1
RowId = Annotated[int, Ge(1), Le(MAX_ROW_ID)]
Cursor = Annotated[int, Ge(0), Le(MAX_ROW_ID)]
JobId = Annotated[RowId, Path(description="The job's id")]
After = Annotated[Cursor | None, Query(description="The `next_cursor` of the previous page")]

SettingsDep = Annotated[Settings, Depends(_settings)]
DatabaseDep = Annotated[Database, Depends(_database)]
SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="An API key from GLUEJOBS_API_KEYS or GLUEJOBS_ADMIN_KEYS")


async def get_keys(request: Request) -> KeyRing:
    keys: KeyRing = request.app.state.keys
    return keys


async def get_principal(
    request: Request,
    keys: Annotated[KeyRing, Depends(get_keys)],
    # Declared so that OpenAPI documents the bearer scheme; the header is read by the key ring, the
    # same way the request guard read it (one parser for both).
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller. The request guard found it for every /v1 request (and refused unknown keys);
    routes need its identity for ownership checks."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:  # a route the guard does not admit (outside /v1 and /metrics)
        principal = await anyio.to_thread.run_sync(keys.principal, request.headers.get("authorization"))
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


async def _store(request: Request) -> Store:
    return get_store(request)


StoreDep = Annotated[Store, Depends(_store)]


# A mistyped `model:NAME` is matched against the caller's newest this many registered models.
SUGGESTED_MODELS = 1000


def get_data_scope(
    settings: SettingsDep, principal: PrincipalDep, session: SessionDep, store: StoreDep
) -> DataScope:
    """Where the caller's data paths resolve (shared/jobspec/data_scope.py): the whole data folder without
    keys and for admin keys, the key owner's own folder for every other key; uploaded files by id
    among the caller's own (admin keys: anyone's), checked by what their upload's check found
    (never read again for that); fetched into this machine's cache only when rows must be read."""

    def uploaded(file_id: str, field: str) -> tuple[UploadedFile, bool]:
        row = jobs_repo.row_id(file_id)
        try:
            if row is None:
                raise NotFound()
            file = jobs_repo.get_file(session, file_id=row, owner=principal.owner_filter)
        except NotFound:
            raise NotFound(f"{file_id} not found", field=f"spec.{field}") from None
        record = UploadedFile(id=file_id, filename=file.filename, bytes=file.bytes, sha256=file.sha256)
        # What the upload's check found stands in for the file: a job on it does not read it again.
        stored[file.sha256] = StoredUpload(
            rows=file.rows, columns=list(file.columns), checks=dict(file.checks)
        )
        return record, file.owner == principal.owner

    def fetch(record: UploadedFile) -> FilePath:
        return local_copy(store, settings.cache_dir, sha256=record.sha256, suffix=record.suffix)

    def registered(owner: str | None, name: str) -> RegisteredModel:
        try:
            model = jobs_repo.get_model(
                session, name=name, owner=owner or principal.owner, caller=principal.owner_filter
            )
        except NotFound:
            raise NotFound(
                f"no registered model {reference(name, owner)!r}{_near_models(name, owner)} (gluejobs "
                "models ls lists yours)",
                field="spec.model_name_or_path",
            ) from None
        return RegisteredModel(name=model.name, owner=model.owner, sha256=model.sha256, bytes=model.bytes)

    def _near_models(name: str, owner: str | None) -> str:
        # Among the models the caller may name this way: their own, or (admins) the owner's named.
        if owner is not None and owner != principal.owner and not principal.is_admin:
            return ""
        rows, _more = jobs_repo.list_models(session, limit=SUGGESTED_MODELS, owner=owner or principal.owner)
        return did_you_mean(name, [row.name for row in rows], prefix=reference("", owner))

    def job_model_record(source: JobSource, *, pin: bool = True) -> RegisteredModel:
        # A job's model (job:ID…): the caller's jobs (admins: anyone's), copied by the store by hash;
        # pinned for a job that is stored (DataScope.without_pins: a dry run's is not).
        try:
            record, _files = job_model(
                session,
                store,
                source=source,
                caller=principal.owner_filter,
                scratch=settings.cache_dir / "uploads",
                pin=pin,
            )
        except FileNotFoundError:  # a checkpoint rotated or pruned away, the job deleted, meanwhile
            raise Conflict(
                f"job {source.job_id}: the model's files left the store while it was being copied (a "
                "checkpoint removed, or the job deleted); name another",
                field="spec.model_name_or_path",
            ) from None
        return record

    stored: dict[str, StoredUpload] = {}
    return data_scope(
        settings,
        owner=principal.owner,
        is_admin=principal.is_admin,
        uploads=uploaded,
        stored=stored,
        fetch=fetch,
        models=registered,
        job_models=job_model_record,
    )


DataScopeDep = Annotated[DataScope, Depends(get_data_scope)]


def get_job(
    job_id: JobId,
    session: SessionDep,
    principal: PrincipalDep,
) -> Job:
    """The job, or a 404 (also for another key's job: its existence is not revealed)."""
    return jobs_repo.get_job(session, job_id=job_id, owner=principal.owner_filter)


JobDep = Annotated[Job, Depends(get_job)]


def get_sweep(
    sweep_id: Annotated[RowId, Path(description="The sweep's id")],
    session: SessionDep,
    principal: PrincipalDep,
) -> Sweep:
    """The sweep, or a 404 (also for another key's sweep)."""
    return jobs_repo.get_sweep(session, sweep_id=sweep_id, owner=principal.owner_filter)


SweepDep = Annotated[Sweep, Depends(get_sweep)]


def get_search(
    search_id: Annotated[RowId, Path(description="The search's id")],
    session: SessionDep,
    principal: PrincipalDep,
) -> Search:
    """The search, or a 404 (also for another key's search)."""
    return search_store.get_search(session, search_id=search_id, owner=principal.owner_filter)


SearchDep = Annotated[Search, Depends(get_search)]


FileName = Annotated[str, Path(description="The file's id: file-7", pattern=r"^file-[0-9]{1,18}$")]


def get_file(file_id: FileName, session: SessionDep, principal: PrincipalDep) -> File:
    """The uploaded file, or a 404 (also for another key's file: its existence is not revealed)."""
    row = jobs_repo.row_id(file_id)
    if row is None:
        raise NotFound(f"{file_id} not found")
    try:
        return jobs_repo.get_file(session, file_id=row, owner=principal.owner_filter)
    except NotFound:
        raise NotFound(f"{file_id} not found") from None


FileDep = Annotated[File, Depends(get_file)]


ModelName = Annotated[str, Path(description="The model's name", pattern=NAME_PATTERN)]
ModelOwner = Annotated[
    str | None, Query(description="Admins: the owner whose model of that name (default: your own)")
]


def get_model(
    name: ModelName, session: SessionDep, principal: PrincipalDep, owner: ModelOwner = None
) -> StoredModel:
    """The registered model, or a 404 (also for another key's model: its existence is not revealed)."""
    return jobs_repo.get_model(
        session, name=name, owner=owner or principal.owner, caller=principal.owner_filter
    )


ModelDep = Annotated[StoredModel, Depends(get_model)]
