"""Registered models (the API's /v1/models routes), and the link of a job to the model it names.

A model's files live in the store by sha256, its manifest by the manifest's sha256
(shared/jobspec/registered_models.py); a row here is one owner's name for them. Names are unique per owner.
A job names a model in its spec (`model:NAME`, with the model's record under `registered_model`);
`link_model` records that use inside the job's own transaction, locking the model's row, and
`delete_model` refuses (409) while a queued or running job holds it, as for uploaded files.

Another job's model (`job:ID…`, shared/jobspec/job_sources.py) has no row: `find_job_model` says
where its files are in the job's folder, after the one ownership check, or why it cannot be used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.errors import Conflict, InvalidSpec, NotFound
from shared.core.ownership import _newest_first, _owned
from shared.core.tables import Checkpoint, Job, JobModel, JobStatus, StoredModel, utcnow
from shared.jobs_repo.files import _USING
from shared.jobspec.job_sources import JobSource, job_reference
from shared.wire.job_folder import checkpoint_path


@dataclass(frozen=True)
class NewModel:
    owner: str | None
    name: str
    sha256: str
    bytes: int
    model_type: str
    files: list[dict[str, Any]]


def add_model(session: Session, *, new: NewModel) -> StoredModel:
    """A new model; Conflict when the owner already has a model of that name."""
    with write(session):
        if _named(session, new.owner, new.name) is not None:
            raise Conflict(
                f"you already have a model named {new.name!r}: delete it first, or choose another name",
                field="name",
            )
        model = StoredModel(**vars(new), created_at=utcnow())
        session.add(model)
        session.flush()
        return model


def has_model(session: Session, *, owner: str | None, name: str) -> bool:
    """Whether the owner has a model of that name (checked before an upload is stored)."""
    with read(session):
        return _named(session, owner, name) is not None


def held_objects(
    session: Session, *, owner: str | None = None, everyone: bool = False
) -> tuple[set[str], set[str]]:
    """(the sha256 of the files, those of the manifests) that models' rows hold: `owner`'s alone
    (the dedup of an upload, which must learn nothing of other owners), or everyone's (what may
    leave the store). Models are few (a team's base models): their file lists are read whole."""
    query = select(StoredModel.sha256, StoredModel.files)
    if not everyone:
        query = query.where(StoredModel.owner.is_(None) if owner is None else StoredModel.owner == owner)
    blobs: set[str] = set()
    manifests: set[str] = set()
    with read(session):
        for sha256, files in session.execute(query):
            manifests.add(sha256)
            blobs.update(str(entry["sha256"]) for entry in files)
    return blobs, manifests


def _named(session: Session, owner: str | None, name: str, *, lock: bool = False) -> StoredModel | None:
    same_owner = StoredModel.owner.is_(None) if owner is None else StoredModel.owner == owner
    query = select(StoredModel).where(same_owner, StoredModel.name == name)
    return session.scalars(query.with_for_update() if lock else query).first()


def _find(
    session: Session, *, name: str, owner: str | None, caller: str | None, lock: bool = False
) -> StoredModel:
    """The model `name` of `owner`, through the one ownership check (`caller`: the owner a non-admin
    caller must be, None for admins and without keys); NotFound also for another owner's model."""
    found = _named(session, owner, name)
    try:
        if found is None:
            raise NotFound()
        return _owned(session, StoredModel, found.id, caller, lock=lock)
    except NotFound:
        raise NotFound(f"model {name!r} not found") from None


def get_model(session: Session, *, name: str, owner: str | None, caller: str | None) -> StoredModel:
    """The model `name` in `owner`'s names, or NotFound (also for a model `caller` may not see)."""
    with read(session):
        return _find(session, name=name, owner=owner, caller=caller)


def list_models(
    session: Session, *, after: int | None = None, limit: int = 20, owner: str | None = None
) -> tuple[list[StoredModel], bool]:
    """Newest first; `owner` None: everyone's (admins, and without keys)."""
    return _newest_first(session, select(StoredModel), StoredModel, after=after, limit=limit, owner=owner)


def delete_model(
    session: Session, *, name: str, owner: str | None, caller: str | None
) -> tuple[StoredModel, set[str], bool]:
    """Delete the model: (its row, the sha256 of its files no other model holds, whether no other
    model holds its manifest: what may leave the store). Conflict while a queued or running job uses it."""
    with write(session):
        model = _find(session, name=name, owner=owner, caller=caller, lock=True)
        users = list(
            session.scalars(
                select(Job.id)
                .join(JobModel, JobModel.job_id == Job.id)
                .where(JobModel.model_id == model.id, Job.status.in_(_USING))
                .order_by(Job.id)
            )
        )
        if users:
            raise Conflict(
                f"model {model.name!r} is used by {'job' if len(users) == 1 else 'jobs'} "
                f"{', '.join(map(str, users[:10]))}, still queued or running; delete it once they end"
            )
        session.execute(delete(JobModel).where(JobModel.model_id == model.id))
        session.delete(model)
        session.flush()
        # Models are few (a team's base models): their file lists are read whole.
        manifests: set[str] = set()
        blobs: set[str] = set()
        for other_sha, files in session.execute(select(StoredModel.sha256, StoredModel.files)):
            manifests.add(other_sha)
            blobs.update(str(entry["sha256"]) for entry in files)
    return model, {entry["sha256"] for entry in model.files} - blobs, model.sha256 not in manifests


@dataclass(frozen=True)
class JobModelFiles:
    """Where a job's model is: `folder` in the job's folder ("" for its final model, "merged" for a
    LoRA job's merged model, "checkpoints/checkpoint-300"), and the step of a checkpoint."""

    job_id: int
    owner: str | None
    folder: str
    step: int | None
    # A LoRA job's adapter: the base it was trained on, as the LoRA job's stored spec names and pins it.
    base_model_name_or_path: str | None = None
    base_model: Mapping[str, Any] | None = None

    @property
    def reference(self) -> str:
        return job_reference(self.job_id, self.step)


def find_job_model(
    session: Session,
    *,
    source: JobSource,
    caller: str | None,
    field: str = "spec.model_name_or_path",
    adapters: bool = False,
) -> JobModelFiles:
    """The files of the model `source` names, through the one ownership check (`caller`: the owner a
    non-admin caller must be); NotFound (also for another owner's job), Conflict when the job has not
    got there yet (no final model before it succeeded), InvalidSpec when it never will. A LoRA job's
    adapter (its final model, unless it saved a merged one, and its checkpoints) with `adapters` (a
    job's spec: the worker loads it on its base, worker/training/lora_sources.py), InvalidSpec without (a
    registered model is a full model)."""
    with read(session):
        try:
            job = _owned(session, Job, source.job_id, caller)
        except NotFound:
            raise NotFound(f"job {source.job_id} not found", field=field) from None
        lora = bool(job.spec.get("apply_lora"))
        name = job_reference(job.id) + ("/best" if source.best else "")
        if source.is_final:
            if job.status != JobStatus.succeeded:
                raise Conflict(
                    f"job {job.id} is {job.status}: its final model exists once it has succeeded; a "
                    f"declared checkpoint ({job_reference(job.id)}/checkpoint-N) can be named before",
                    field=field,
                )
            if lora:
                if job.spec.get("save_merged_model"):
                    return JobModelFiles(job.id, job.owner, "merged", None)
                if not adapters:
                    raise InvalidSpec(_lora_words(job.id, "its final model"), field=field)
                return _adapter(job, "", None)
            return JobModelFiles(job.id, job.owner, "", None)
        query = select(Checkpoint).where(Checkpoint.job_id == job.id)
        if source.best:
            query = query.where(Checkpoint.is_best.is_(True))
        else:
            query = query.where(Checkpoint.step == source.step)
        checkpoint = session.scalars(query.order_by(Checkpoint.step.desc())).first()
        if checkpoint is None:
            steps = list(
                session.scalars(
                    select(Checkpoint.step).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step)
                )
            )
            have = (
                f"its declared checkpoints are at steps {', '.join(map(str, steps[-10:]))}"
                if steps
                else "it has declared no checkpoint (save_strategy no, or none saved yet)"
            )
            what = "no best checkpoint" if source.best else f"no checkpoint at step {source.step}"
            error = Conflict if not job.status.is_terminal and not steps else InvalidSpec
            raise error(f"{name}: job {job.id} has {what}; {have}", field=field)
        folder = checkpoint_path(checkpoint.step)
        if lora:
            if not adapters:
                raise InvalidSpec(
                    _lora_words(job.id, f"its checkpoint at step {checkpoint.step}"), field=field
                )
            return _adapter(job, folder, checkpoint.step)
        return JobModelFiles(job.id, job.owner, folder, checkpoint.step)


def _adapter(job: Job, folder: str, step: int | None) -> JobModelFiles:
    base = job.spec.get("registered_model")
    return JobModelFiles(
        job.id,
        job.owner,
        folder,
        step,
        base_model_name_or_path=str(job.spec["model_name_or_path"]),
        base_model=base if isinstance(base, dict) else None,
    )


def _lora_words(job_id: int, what: str) -> str:
    return (
        f"job {job_id} trained a LoRA adapter: {what} is the adapter alone, not a full model to register; "
        f"a job can start from it (job:{job_id}…, loaded on its base model), or register the merged model "
        "of a LoRA job that saved one (save_merged_model: true)"
    )


def link_model(session: Session, *, job: Job, registered: Mapping[str, Any] | None) -> None:
    """Record, inside the job's write transaction, the model the spec names (`registered`: the spec's
    `registered_model`); NotFound when it has been deleted or replaced since the spec was checked."""
    if not registered or registered.get("job") is not None:  # a job's model has no row to hold
        return
    model = _named(session, registered.get("owner"), str(registered.get("name")), lock=True)
    if model is None or model.sha256 != registered.get("sha256"):
        raise NotFound(f"model {registered.get('name')!s} no longer exists", field="spec.model_name_or_path")
    session.add(JobModel(job_id=job.id, model_id=model.id))
