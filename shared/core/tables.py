"""Database tables (SQLAlchemy 2 typed models), shared by the API and the workers."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# A job's statuses are the client's and the dashboard's words too: their one home is the wire module.
from shared.wire.vocabulary import TERMINAL_STATUSES as TERMINAL_STATUSES
from shared.wire.vocabulary import JobStatus as JobStatus


class ErrorCode(StrEnum):
    """Why a job failed (jobs.error_code). The first group is the job's own doing: retrying cannot
    help, so the job fails at once. The second comes from outside the job: it is retried with
    backoff while attempts remain, resuming from the newest checkpoint."""

    invalid_data = "invalid_data"  # a file missing or malformed, labels that do not fit, a bad spec
    model_load_failed = "model_load_failed"
    timeout = "timeout"  # ran past the spec's max_runtime_s
    internal = "internal"  # an unexpected exception: a bug, which a retry would only repeat
    out_of_memory = "out_of_memory"
    killed = "killed"  # a signal from outside (the OOM killer, an operator), or the interpreter crashed
    device_error = "device_error"  # CUDA / NCCL failures
    database_unreachable = "database_unreachable"
    worker_lost = "worker_lost"  # its worker stopped heartbeating
    storage_unreachable = "storage_unreachable"  # the file store stayed away (GLUEJOBS_STORAGE_RETRY_S)
    # The worker's disk filled up (ENOSPC, a quota): the worker's problem, not the job's. Handed back
    # without spending an attempt, at most GLUEJOBS_MAX_RESOURCE_HANDBACKS times (jobs_repo.hand_back_job).
    no_space = "no_space"
    # Not a failure: a search's pruner stopped the trial early, by the cancel path (status cancelled).
    pruned = "pruned"

    @property
    def retryable(self) -> bool:
        return self not in _JOB_OWN_FAULTS


_JOB_OWN_FAULTS = frozenset(
    {ErrorCode.invalid_data, ErrorCode.model_load_failed, ErrorCode.timeout, ErrorCode.internal}
)

ACTIVE_STATUSES = frozenset({JobStatus.running, JobStatus.cancelling})


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every database (SQLite stores them naive, in UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# BIGINT on Postgres; INTEGER on SQLite, where only "INTEGER PRIMARY KEY" auto-increments.
BigId = BigInteger().with_variant(Integer(), "sqlite")
# JSON, not JSONB, on Postgres too: json keeps the text as written, so a spec comes back in its
# field order and label counts in label order, as on SQLite; JSONB re-sorts keys (by length, then
# bytes: `bf16, fast, fp16 …`). Nothing queries inside these columns but by a key (`->>`), which
# json serves as well; JSONB's indexing and equality are not used.
Json = JSON()

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_owner_id", "owner", "id"),
        Index("ix_jobs_worker_id", "worker_id"),
        Index("ix_jobs_sweep_id", "sweep_id"),
        # Each claim asks for the job its worker reserved (reservations.py my_reservation): without
        # it, a scan of every queued job (8 ms of the claim's 12 ms in Postgres at 10,000 queued).
        Index("ix_jobs_reserved_by", "reserved_by"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    status: Mapped[JobStatus] = mapped_column(
        Enum(
            JobStatus,
            native_enum=False,
            length=16,
            name="job_status",
            validate_strings=True,
            create_constraint=True,
        ),
        default=JobStatus.queued,
    )
    spec: Mapped[dict[str, Any]] = mapped_column(Json)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", Json, default=dict)
    # The owner (a person or a team) whose key created the job; None when auth is off.
    owner: Mapped[str | None] = mapped_column(String(64))

    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    worker_id: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    error: Mapped[str | None] = mapped_column(Text)
    output_dir: Mapped[str | None] = mapped_column(String(1024))
    # Kept on the job so that reading one job never scans its metric rows.
    latest_metrics: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    best_metrics: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # What the training run reports at the end: parameter counts, throughput, peak memory …
    result: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # Machine-readable cause of a failure (invalid_data, model_load_failed, out_of_memory, killed …).
    error_code: Mapped[str | None] = mapped_column(String(32))
    # A retried job is not claimed before this time (exponential backoff between attempts).
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Devices (GPUs, or CPU slots) the job needs at once; a claim needs this many free.
    num_processes: Mapped[int] = mapped_column(Integer, default=1)
    # The devices the running attempt holds, e.g. ["0", "1"] (CUDA indices) or ["cpu"].
    devices: Mapped[list[str] | None] = mapped_column(Json)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    # The job this one repeats (POST /v1/jobs/{id}/rerun).
    rerun_of: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    # Reproducibility record, written when an attempt starts: library versions, device, data hashes.
    environment: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # What the API accepted but the user should know (a model it could not check, a label that looks
    # like a typo of another …), written once when the job is created.
    warnings: Mapped[list[str] | None] = mapped_column(Json)
    # A wide job that has waited past GLUEJOBS_RESERVATION_AFTER_S holds this worker: narrower jobs no
    # longer take its devices until this job starts there (shared/jobs_repo/reservations.py).
    reserved_by: Mapped[str | None] = mapped_column(String(255))
    reserved_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


# The claim: queued jobs by priority (highest first), then age — the index in the claim's own order,
# so a tier's `ORDER BY priority DESC, id LIMIT 1` stops at its first row instead of sorting the
# highest priority's jobs by id (3.7 of a claim's 7 ms in Postgres at 10,000 queued).
Index("ix_jobs_status_priority_id", Job.status, Job.priority.desc(), Job.id)


class JobMetric(Base):
    __tablename__ = "job_metrics"
    __table_args__ = (
        # A resumed attempt re-logs the steps after its checkpoint: the key keeps them single.
        UniqueConstraint("job_id", "split", "name", "step"),
        # Cursor polling (`after=`) is an index range scan whatever the job's size.
        Index("ix_job_metrics_job_id_id", "job_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    epoch: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The attempt that wrote the row (fencing: a stale attempt's writes are refused).
    attempt: Mapped[int | None] = mapped_column(Integer)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    epoch: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(1024))
    metrics: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    is_best: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class CheckpointSize(Base):
    """A declared checkpoint's bytes in the store, sized by the API's storage sweep (a row of its own,
    not a column of checkpoints: the workers' code reads checkpoints on any schema since 0.1.0). Goes
    with its checkpoint (rotation, removal, the job's deletion)."""

    __tablename__ = "checkpoint_sizes"
    __table_args__ = (Index("ix_checkpoint_sizes_owner", "owner"),)

    checkpoint_id: Mapped[int] = mapped_column(
        ForeignKey("checkpoints.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    bytes: Mapped[int] = mapped_column(BigInteger)
    # Its job's owner, copied when it is sized: an owner's sum is one indexed scan of this table.
    owner: Mapped[str | None] = mapped_column(String(64))


class JobOutputSize(Base):
    """A finished job's files in the store but its checkpoints (model, predictions, logs …), sized by
    the API's storage sweep once the job has finished."""

    __tablename__ = "job_output_sizes"
    __table_args__ = (Index("ix_job_output_sizes_owner", "owner"),)

    job_id: Mapped[int] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    bytes: Mapped[int] = mapped_column(BigInteger)
    owner: Mapped[str | None] = mapped_column(String(64))  # the job's owner, copied when it is sized


class StoreDeletion(Base):
    """A store folder whose rows are gone and whose removal is not finished: written in the
    transaction that deletes the rows, removed once the objects are (a crash between the two leaves
    it to the API's storage sweep). Rows first, then objects: no row ever names a missing object, and
    no object without a row outlives the next sweep (shared/jobs_repo/storage_usage.py)."""

    __tablename__ = "store_deletions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(1024))  # the store's key: jobs/7/checkpoints/checkpoint-300
    job_id: Mapped[int | None] = mapped_column(BigInteger)  # whose it was (no foreign key: it may go)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobGang(Base):
    """A job's attempt across several worker machines (issue 37): the rank-0 worker holds the job's
    claim and opened the gang with the rendezvous it reserved (its advertised address and a port it
    bound); the other members joined it (JobGangMember). Removed when the attempt ends or the gang is
    released unfilled, so a member whose gang row is gone writes nothing."""

    __tablename__ = "job_gangs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    attempt: Mapped[int] = mapped_column(Integer)
    # Random, per gang: ids and attempt numbers come back (SQLite reuses a freed id, a released gang
    # hands its attempt back), a token never does, so a seat of an earlier gang never passes as one now.
    token: Mapped[str] = mapped_column(String(32))
    size: Mapped[int] = mapped_column(Integer)
    address: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    full_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class JobGangMember(Base):
    """A worker's seat in a gang: its rank (0 is the gang's opener), and its last heartbeat."""

    __tablename__ = "job_gang_members"
    __table_args__ = (UniqueConstraint("gang_id", "worker_id"),)

    gang_id: Mapped[int] = mapped_column(
        ForeignKey("job_gangs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    worker_id: Mapped[str] = mapped_column(String(255))
    joined_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (
        Index("ix_job_events_job_id_id", "job_id", "id"),
        UniqueConstraint("job_id", "dedup_key"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(16))  # "state" (a status change) or "log"
    level: Mapped[str] = mapped_column(String(16), default="info")
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(Json)
    attempt: Mapped[int | None] = mapped_column(Integer)
    # Set by a job's process on the events it queues ("<attempt>-<process token>-<sequence>"): a
    # write that committed but whose acknowledgement was lost is retried without a second row.
    dedup_key: Mapped[str | None] = mapped_column(String(64))


class WorkerState(StrEnum):
    idle = "idle"
    busy = "busy"
    draining = "draining"  # stopping: takes no more work, hands its jobs back
    low_disk = "low_disk"  # below its free-space floor: claims nothing until it has room again
    stopped = "stopped"  # said goodbye; "gone" (no heartbeat for a lease) is derived, never stored


# A worker in these states takes work (if it was heard from within a lease): the claim's reservations
# and the API's explanation of a waiting job count the same workers.
LIVE_WORKER_STATES = (WorkerState.idle, WorkerState.busy)


class Worker(Base):
    """A worker process. Its current jobs are the jobs whose worker_id is its id."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    version: Mapped[str | None] = mapped_column(String(64))
    # What the worker can run on: CUDA indices ("0", "1" …) or CPU slots ("cpu0", "cpu1" …).
    devices: Mapped[list[str]] = mapped_column(Json, default=list)
    state: Mapped[str] = mapped_column(String(16), default=WorkerState.idle)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Sweep(Base):
    """A base spec run once per combination of seeds and grid values; its jobs carry its id."""

    __tablename__ = "sweeps"
    __table_args__ = (Index("ix_sweeps_owner_id", "owner", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(Json)
    seeds: Mapped[list[int]] = mapped_column(Json, default=list)
    grid: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", Json, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class IdempotencyKey(Base):
    """POST /v1/jobs with an Idempotency-Key: the same key and body from the same owner returns the
    job it created."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (
        UniqueConstraint("owner", "key"),
        Index("ix_idempotency_keys_created_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # The owner's key digest; "" without auth (a NULL would not take part in the unique key).
    owner: Mapped[str] = mapped_column(String(64), default="")
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Owner(Base):
    """A person or a team: what jobs, sweeps, files and keys belong to (`owner` columns hold its name).

    Rows are made on first use (an owner's first key, or a quota an admin sets); the `owner` columns
    of jobs and sweeps are plain names rather than foreign keys, so that a job outlives its owner's
    row and reads never join. Per-owner scheduling settings (share, quotas) are columns of this row.
    """

    __tablename__ = "owners"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Fair share's weight: an owner with share 2 may hold twice the devices before others go first.
    share: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    # Quotas; None: the configured default (GLUEJOBS_DEFAULT_MAX_…), which may itself be no limit.
    max_devices: Mapped[int | None] = mapped_column(Integer)
    max_queued: Mapped[int | None] = mapped_column(Integer)
    max_device_hours_per_day: Mapped[float | None] = mapped_column(Float)


class OwnerStorageQuota(Base):
    """An owner's own max_storage_bytes (None: the configured default), set over PATCH /v1/owners.
    A table of its own rather than a column of owners: the claim of any build since 0.1.0 reads the
    owners' rows whole, and a new column would break it on the previous schema mid-upgrade."""

    __tablename__ = "owner_storage_quotas"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    max_storage_bytes: Mapped[int | None] = mapped_column(BigInteger)


class KeyRole(StrEnum):
    user = "user"  # submits, reads and cancels its owner's jobs
    admin = "admin"  # every owner's jobs, keys, quotas and the audit log
    read_only = "read-only"  # reads its owner's jobs; submits and cancels nothing


class ApiKey(Base):
    """A key made over the API (POST /v1/keys). Only the SHA-256 digest of the secret is kept; the
    secret is shown once, when the key is made. Configured keys (GLUEJOBS_API_KEYS) are not rows."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("digest"), Index("ix_api_keys_owner", "owner"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64))  # the holder's label: "alice-laptop"
    owner: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16), default=KeyRole.user)
    prefix: Mapped[str] = mapped_column(String(16))  # the secret's first characters, to tell keys apart
    digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(64))  # the owner whose admin key made it
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The key this one replaced (POST /v1/keys/{id}/rotate).
    rotated_from: Mapped[int | None] = mapped_column(BigId)


class RateWindow(Base):
    """Requests one key made in one minute, by kind (reads, writes): every API process counts in the
    same row, so a limit holds however many processes serve the API (service/edge/rate_limits.py)."""

    __tablename__ = "rate_windows"

    bucket: Mapped[str] = mapped_column(String(96), primary_key=True)  # "<kind>:<key id or digest>"
    window: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # minutes since the epoch
    count: Mapped[int] = mapped_column(Integer, default=0)


class OpenStream(Base):
    """An event stream being served, so that one key's open streams are counted across every API
    process. A stream refreshes `seen_at` while it runs; a row not refreshed for a while belongs to a
    process that died and no longer counts."""

    __tablename__ = "open_streams"
    __table_args__ = (Index("ix_open_streams_bucket", "bucket"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    bucket: Mapped[str] = mapped_column(String(96))  # the key, as in rate_windows
    job_id: Mapped[int] = mapped_column(BigId)
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditEntry(Base):
    """Who changed what outside a job's own life: keys created, revoked and rotated, quotas and
    shares set. A job's own history (created, cancelled, rerun — and by whom) is in its events."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_created_at", "created_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The owner acting (None: the operator, through configuration or the command line).
    actor: Mapped[str | None] = mapped_column(String(64))
    # The id of the key that acted, when it was a key stored in the database.
    actor_key_id: Mapped[int | None] = mapped_column(BigId)
    action: Mapped[str] = mapped_column(String(64))  # "key.create", "key.revoke", "quota.set" …
    target: Mapped[str] = mapped_column(String(255))  # what it acted on: "key 12", "owner alice" …
    data: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)  # never a secret


class File(Base):
    """An uploaded data file (POST /v1/files). Its bytes are the store's `files/<sha256>`, one object
    for every row with that digest: the same bytes uploaded twice are stored once."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_owner_id", "owner", "id"), Index("ix_files_sha256", "sha256"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    owner: Mapped[str | None] = mapped_column(String(64))  # as a job's owner
    filename: Mapped[str] = mapped_column(String(255))
    format: Mapped[str] = mapped_column(String(16))  # csv, tsv, json, jsonl, parquet
    purpose: Mapped[str] = mapped_column(String(16))  # train, validation or test
    task_name: Mapped[str | None] = mapped_column(String(16))  # the task its labels were checked against
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    rows: Mapped[int] = mapped_column(BigInteger)
    columns: Mapped[list[str]] = mapped_column(Json, default=list)
    # What the checks found: text columns, and label counts or the score range.
    checks: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobFile(Base):
    """A job's use of an uploaded file (spec field → file): a file a queued or running job uses
    cannot be deleted."""

    __tablename__ = "job_files"
    __table_args__ = (Index("ix_job_files_file_id", "file_id"),)

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    field: Mapped[str] = mapped_column(String(32), primary_key=True)
    file_id: Mapped[int] = mapped_column(ForeignKey("files.id", ondelete="CASCADE"))


class StoredModel(Base):
    """A model folder registered once (POST /v1/models) and named by jobs as `model:NAME`. Its files
    are the store's `models/blobs/<sha256>`; its manifest, `models/manifests/<sha256>.json`, is what
    `sha256` hashes: two rows with one sha256 hold the same files."""

    __tablename__ = "models"
    __table_args__ = (
        UniqueConstraint("owner", "name"),
        Index("ix_models_owner_id", "owner", "id"),
        Index("ix_models_sha256", "sha256"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    owner: Mapped[str | None] = mapped_column(String(64))  # as a job's owner
    name: Mapped[str] = mapped_column(String(64))
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    model_type: Mapped[str] = mapped_column(String(64))
    # The manifest's entries, [{path, bytes, sha256}] by path: what its files are, without the store.
    files: Mapped[list[dict[str, Any]]] = mapped_column(Json, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobModel(Base):
    """A job's use of a registered model: a model a queued or running job uses cannot be deleted."""

    __tablename__ = "job_models"
    __table_args__ = (Index("ix_job_models_model_id", "model_id"),)

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))


class ReleaseRecord(Base):
    """One row: which releases may work on this database (shared/core/release.py), written by migrate."""

    __tablename__ = "gluejobs_release"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    schema_revision: Mapped[str] = mapped_column(String(32))
    # The oldest release whose API and workers may work on the schema.
    min_release: Mapped[str] = mapped_column(String(32))
    migrated_by: Mapped[str] = mapped_column(String(32))  # the release that wrote the row
    migrated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # {revision: sha256 of its migration file} for every migration the schema went through, as the
    # migrating build's files read: a renumbered or edited migration never passes for applied.
    migration_digests: Mapped[dict[str, str] | None] = mapped_column(Json)


class WorkerBuild(Base):
    """A build workers run (shared/core/build.py): its release, code hash, commit, the schema head
    it knows and the spec fields it supports. A worker row names its build in `version`
    ("0.2.0+<build>"); GET /v1/workers shows each worker's build from here."""

    __tablename__ = "worker_builds"

    build: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(64))
    commit: Mapped[str | None] = mapped_column(String(64))
    schema_head: Mapped[str] = mapped_column(String(32))
    spec_fields: Mapped[list[str]] = mapped_column(Json, default=list)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class SearchStatus(StrEnum):
    running = "running"  # trials are being asked for, run or pruned
    succeeded = "succeeded"  # every trial ended and at least one completed
    failed = "failed"  # every trial ended and none completed
    cancelled = "cancelled"


class Search(Base):
    """A hyperparameter search (shared/searches): a base spec, a space, an objective, a budget, a
    sampler and a pruner. Its trials are ordinary jobs (search_trials names them). The sampler's
    and pruner's state is rebuilt from these rows on every step of its driver, so that any API
    process can drive it after another stopped (`driver_id` holds it until `driver_lease_until`)."""

    __tablename__ = "searches"
    __table_args__ = (Index("ix_searches_owner_id", "owner", "id"), Index("ix_searches_status", "status"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    owner: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default=SearchStatus.running)
    spec: Mapped[dict[str, Any]] = mapped_column(Json)  # the base spec, without the searched fields
    space: Mapped[dict[str, Any]] = mapped_column(Json)
    objective: Mapped[dict[str, Any]] = mapped_column(Json)  # {metric, direction}
    n_trials: Mapped[int] = mapped_column(Integer)
    parallelism: Mapped[int] = mapped_column(Integer)
    sampler: Mapped[dict[str, Any]] = mapped_column(Json)
    pruner: Mapped[dict[str, Any]] = mapped_column(Json)
    seed: Mapped[int] = mapped_column(BigInteger)  # the sampler's; each trial's draw is seeded from it
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", Json, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    driver_id: Mapped[str | None] = mapped_column(String(255))
    driver_lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    best_trial: Mapped[int | None] = mapped_column(Integer)  # its number
    note: Mapped[str | None] = mapped_column(Text)  # why it waits (a quota), or why it ended
    rerun_seeds: Mapped[list[int] | None] = mapped_column(Json)  # re-run the best over these seeds
    seeds_sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))


class SearchTrial(Base):
    """One trial of a search: its parameters, its job, what the pruner was told and how it ended."""

    __tablename__ = "search_trials"
    __table_args__ = (UniqueConstraint("search_id", "number"), Index("ix_search_trials_job_id", "job_id"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    search_id: Mapped[int] = mapped_column(ForeignKey("searches.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)  # 0, 1, … as Optuna numbers trials
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    params: Mapped[dict[str, Any]] = mapped_column(Json)
    state: Mapped[str] = mapped_column(String(16), default="running")  # running, complete, pruned, failed
    value: Mapped[float | None] = mapped_column(Float)
    # {evaluation number: objective value}, as reported to the pruner (JSON keys are strings)
    intermediate: Mapped[dict[str, float]] = mapped_column(Json, default=dict)
    system_attrs: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)  # the pruner's (ASHA rungs)
    pruned: Mapped[dict[str, Any] | None] = mapped_column(Json)  # {evaluation, epoch, step, value}
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WebhookEndpoint(Base):
    """An owner's webhook endpoint (POST /v1/webhooks): where events of the chosen types are sent,
    signed with its secret (Standard Webhooks). The secret is kept as it is, because signing needs it;
    no answer but create's and rotate's holds it."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_owner_id", "owner", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    owner: Mapped[str | None] = mapped_column(String(64))  # as a job's owner
    url: Mapped[str] = mapped_column(String(2048))
    event_types: Mapped[list[str]] = mapped_column(Json, default=list)
    description: Mapped[str | None] = mapped_column(String(255))
    secret: Mapped[str] = mapped_column(String(128))  # whsec_<base64 of 32 random bytes>
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DeliveryStatus(StrEnum):
    pending = "pending"  # waiting for its next attempt (or being sent now, under a lease)
    delivered = "delivered"  # the endpoint answered 2xx
    failed = "failed"  # every attempt spent, or the endpoint was deleted meanwhile


class WebhookDelivery(Base):
    """One event for one endpoint: written in the transaction of the change that caused it, sent by
    the API's dispatcher until the endpoint answers 2xx or the attempts are spent. `event_key` makes
    enqueueing idempotent (a repeated write enqueues nothing)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_key"),
        Index("ix_webhook_deliveries_endpoint_id_id", "endpoint_id", "id"),
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    message_id: Mapped[str] = mapped_column(
        String(64)
    )  # the webhook-id header: msg_<hex>, kept across retries
    event_type: Mapped[str] = mapped_column(String(32))
    event_key: Mapped[str] = mapped_column(String(128))
    payload: Mapped[dict[str, Any]] = mapped_column(Json)
    status: Mapped[DeliveryStatus] = mapped_column(
        Enum(DeliveryStatus, native_enum=False, length=16, name="delivery_status"),
        default=DeliveryStatus.pending,
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Each attempt: {at, status_code, error, duration_ms}, oldest first.
    attempt_log: Mapped[list[dict[str, Any]]] = mapped_column(Json, default=list)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # A dispatcher's claim: who sends it now, until when (another API process takes it after that).
    lease_token: Mapped[str | None] = mapped_column(String(32))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
