"""/v1/models: base models registered once, kept in the store by content, named by jobs.

A model folder arrives as a tar in the multipart part `file` (`gluejobs models upload` makes it), is
streamed to this machine's disk (service/files/uploads.py), unpacked member by member and checked as a
loadable transformers folder without torch (shared/model_folders/uploads.py), and only then stored: each
file under its sha256, the manifest of paths and hashes under its own sha256, which is the model's
hash; its row names it for its owner (shared/jobs_repo/model_objects.py: dedup within an owner
only, objects no row holds removed or swept). A refused or cut-off upload keeps nothing. A job names it in
`model_name_or_path` as `model:NAME`; workers fetch it by hash into their cache.

POST /v1/jobs/{id}/model (`promote_router`) registers a job's final model, or one of its checkpoints,
the same way without a byte through a client or the API: the worker wrote the model's manifest beside
it, and the store copies each file it lacks to its blob (shared/jobs_repo/model_objects.py).
"""

from __future__ import annotations

import logging
import re
import secrets
import shutil
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request, status
from sqlalchemy.orm import Session

from service.accounts.owner_views import check_room
from service.deps import After, JobDep, ModelDep, PrincipalDep, SessionDep, SettingsDep, StoreDep
from service.files.uploads import FILE_FIELD, Received, receive_upload
from service.schemas.common import ErrorResponse, Page
from service.schemas.models import ModelDeleted, ModelPromote, ModelPublic
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.errors import Conflict, InvalidRequest, InvalidSpec
from shared.core.storage import Store, StoreUnavailable, model_blob_key, model_manifest_key
from shared.core.tables import StoredModel
from shared.jobs_repo.model_objects import (
    job_model_manifest,
    pinned_objects,
    read_model_type,
    remove_unheld,
    restore_missing,
    store_job_model,
    store_model,
)
from shared.jobs_repo.models import find_job_model
from shared.jobspec.registered_models import NAME_PATTERN
from shared.model_folders.uploads import check_model_folder, unpack_model_tar

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/models", tags=["models"])
promote_router = APIRouter(prefix="/jobs", tags=["models"])

UPLOAD_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": [FILE_FIELD, "name"],
                "properties": {
                    FILE_FIELD: {
                        "type": "string",
                        "format": "binary",
                        "description": "The model folder as an uncompressed tar (tar -C FOLDER -cf - .)",
                    },
                    "name": {"type": "string", "pattern": NAME_PATTERN, "description": "The model's name"},
                },
            }
        }
    },
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublic,
    openapi_extra={"requestBody": UPLOAD_BODY},
    responses={
        409: {"model": ErrorResponse, "description": "You already have a model of that name"},
        413: {
            "model": ErrorResponse,
            "description": "Larger than GLUEJOBS_MAX_MODEL_BYTES, as sent or as its members declare",
        },
        503: {"model": ErrorResponse, "description": "The store or the database is unavailable"},
    },
)
async def create_model(
    request: Request,
    settings: SettingsDep,
    store: StoreDep,
    session: SessionDep,
    principal: PrincipalDep,
) -> ModelPublic:
    """Register a model folder (multipart/form-data: the part `file`, the folder as an uncompressed
    tar; the field `name`). Up to GLUEJOBS_MAX_MODEL_BYTES, sent and unpacked (413 past it). It must
    be a folder transformers loads without remote code: config.json with a known model_type and no
    auto_map, a tokenizer, weights, a declared shape within GLUEJOBS_MAX_MODEL_PARAMETERS; only regular
    files a model folder holds (no links, no `..`, no Python, UTF-8 names, none twice).
    Otherwise 422 naming the problem, and nothing is kept. An owner whose storage quota
    (max_storage_bytes) the model would pass gets 429 (over_quota). Name it in a job as `model:NAME`."""
    # An owner at its storage quota is refused before a byte is read (429 over_quota).
    await anyio.to_thread.run_sync(check_room, session, settings, principal.owner, 0)
    received = await receive_upload(
        request, folder=settings.cache_dir / "uploads", max_bytes=settings.max_model_bytes
    )
    try:
        model = await anyio.to_thread.run_sync(_register, received, settings, store, session, principal.owner)
    finally:
        received.path.unlink(missing_ok=True)
    return ModelPublic.of(model, caller=principal.owner)


def _register(
    received: Received, settings: Settings, store: Store, session: Session, owner: str | None
) -> StoredModel:
    name = received.fields.get("name") or ""
    if not re.fullmatch(NAME_PATTERN, name):
        raise InvalidRequest(
            "give the model a name: letters, digits, '.', '_' and '-', at most 64, starting with a "
            "letter or digit",
            field="name",
        )
    if jobs_repo.has_model(session, owner=owner, name=name):
        raise Conflict(
            f"you already have a model named {name!r}: delete it first, or choose another name", field="name"
        )
    staging = settings.cache_dir / "uploads" / f"model-{secrets.token_hex(8)}"
    try:
        files = unpack_model_tar(received.path, staging, max_bytes=settings.max_model_bytes)
        model_type = check_model_folder(staging, max_parameters=settings.max_model_parameters)
        check_room(session, settings, owner, sum(f.bytes for f in files))
        sha256 = store_model(staging, files, store, session, owner)
        new = jobs_repo.NewModel(
            owner=owner,
            name=name,
            sha256=sha256,
            bytes=sum(f.bytes for f in files),
            model_type=model_type,
            files=[f.model_dump() for f in sorted(files, key=lambda f: f.path)],
        )
        try:
            model = jobs_repo.add_model(session, new=new)  # Conflict: a racing upload took the name
        except BaseException:
            try:
                remove_unheld(session, store, files, sha256)
            except Exception as exc:  # the database or the store is away: the start-up sweep removes them
                logger.warning(
                    "a model's files stay in the store until the next sweep: %s", type(exc).__name__
                )
            raise
        restore_missing(staging, files, store, sha256)
        return model
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@router.get("", response_model=Page[ModelPublic])
def read_models(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 20,
    after: After = None,
) -> dict[str, Any]:
    """Your registered models (admins: everyone's), newest first, in cursor pages."""
    models, has_more = jobs_repo.list_models(session, after=after, limit=limit, owner=principal.owner_filter)
    return {
        "data": [ModelPublic.of(m, caller=principal.owner) for m in models],
        "has_more": has_more,
        "next_cursor": str(models[-1].id) if has_more and models else None,
    }


@router.get("/{name}", response_model=ModelPublic)
def read_model(model: ModelDep, principal: PrincipalDep) -> ModelPublic:
    """One registered model (admins name another owner's with `?owner=`)."""
    return ModelPublic.of(model, caller=principal.owner)


@router.delete("/{name}", response_model=ModelDeleted, responses={409: {"model": ErrorResponse}})
def delete_model(
    model: ModelDep, session: SessionDep, principal: PrincipalDep, store: StoreDep
) -> ModelDeleted:
    """Delete a registered model; 409 while a queued or running job uses it. Its files leave the store
    when no other model holds them; finished jobs keep the record of what they trained from."""
    deleted, blobs, manifest = jobs_repo.delete_model(
        session, name=model.name, owner=model.owner, caller=principal.owner_filter
    )
    try:
        # What a job's pinned model (job:ID in a stored spec) holds stays, whatever the rows say.
        pinned_blobs, pinned_manifests = pinned_objects(store)
        if manifest and deleted.sha256 not in pinned_manifests:
            store.delete(model_manifest_key(deleted.sha256))
        for sha256 in sorted(blobs - pinned_blobs):
            store.delete(model_blob_key(sha256))
    except StoreUnavailable as exc:  # the row is gone; the objects stay behind, unreferenced
        logger.warning("model %s: its files stay in the store: %s", deleted.name, exc.message)
    return ModelDeleted(name=deleted.name)


@promote_router.post(
    "/{job_id}/model",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublic,
    responses={
        404: {"model": ErrorResponse, "description": "No such job (or another owner's)"},
        409: {
            "model": ErrorResponse,
            "description": "You already have a model of that name, or the job has no final model yet",
        },
        422: {
            "model": ErrorResponse,
            "description": "No such checkpoint, or a LoRA job's adapter without a merged model",
        },
        503: {"model": ErrorResponse, "description": "The store or the database is unavailable"},
    },
)
def promote_model(
    job: JobDep,
    body: ModelPromote,
    settings: SettingsDep,
    store: StoreDep,
    session: SessionDep,
    principal: PrincipalDep,
) -> ModelPublic:
    """Register the job's final model (or `checkpoint`: one of its declared checkpoints, or `best`) as
    your model `name` (`model:NAME` in a spec), as GET /v1/models/{name} answers it. Nothing passes
    through a client: the store copies the job's files by hash. 409 when you have a model of that name
    or the job has not succeeded (its final model); 422 for a checkpoint it did not declare, or a LoRA
    job's adapter (a LoRA job that saved a merged model gives that)."""
    if jobs_repo.has_model(session, owner=principal.owner, name=body.name):
        raise Conflict(
            f"you already have a model named {body.name!r}: delete it first, or choose another name",
            field="name",
        )
    source = body.source(job.id)
    scratch = settings.cache_dir / "uploads"
    try:
        found = find_job_model(session, source=source, caller=principal.owner_filter, field="checkpoint")
        files = job_model_manifest(store, found, field="checkpoint")
        sha256 = store_job_model(store, found, files, scratch=scratch, pin=False)
    except InvalidSpec as exc:  # the words a spec gets, about this request's field
        raise InvalidRequest(exc.message, field="checkpoint") from None
    except FileNotFoundError:  # a checkpoint rotated or pruned away, the job deleted, meanwhile
        raise Conflict(
            f"job {job.id}: the model's files left the store while they were being copied (a checkpoint "
            "removed, or the job deleted); name another",
            field="checkpoint",
        ) from None
    new = jobs_repo.NewModel(
        owner=principal.owner,
        name=body.name,
        sha256=sha256,
        bytes=sum(f.bytes for f in files),
        model_type=read_model_type(store, files),
        files=[f.model_dump() for f in sorted(files, key=lambda f: f.path)],
    )
    try:
        model = jobs_repo.add_model(session, new=new)  # Conflict: a racing request took the name
    except BaseException:
        try:
            remove_unheld(session, store, files, sha256)
        except Exception as exc:  # the database or the store is away: the start-up sweep removes them
            logger.warning("a model's files stay in the store until the next sweep: %s", type(exc).__name__)
        raise
    # A model deleted meanwhile may have taken objects this one holds: copied again from the job.
    try:
        store_job_model(store, found, files, scratch=scratch, pin=False)
    except FileNotFoundError:  # and the job's files went too: the start-up sweep cannot bring them back
        logger.warning("model %s: an object a deletion took could not be copied again", body.name)
    logger.info("job %s: promoted to model %s (%s)", job.id, body.name, sha256[:12])
    return ModelPublic.of(model, caller=principal.owner)
