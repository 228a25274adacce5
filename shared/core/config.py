"""Settings, read once from the environment (prefix GLUEJOBS_) by both the API and the workers.

One `Settings` is what every process builds (`get_settings()`), composed of groups by who reads them,
so that a reader of this file sees what a worker needs apart from what only the API needs:
`CommonSettings` (the database, the store and the folders: everyone), `SchedulingSettings` (fair share
and quotas: the API at submission, the workers at claim), `WorkerSettings` (the workers alone),
`ApiSettings`, `DataLimitSettings` and `WebhookSettings` (the API alone). The groups are flat mixins of
one class, not nested models: a nested model would change the environment names (GLUEJOBS_API__…), and
every name here is part of an operator's configuration. docs/operators/configuration.md shows the same
groups (tests/project/test_settings_layout.py holds the two together).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_VAR_DIR = Path("var")


def _split_keys(value: object) -> object:
    """Accept keys as a comma-separated string (how they arrive from the environment)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _split_names(value: object) -> object:
    """Names (hosts, origins, trackers) as `_split_keys` reads them, lowercased."""
    return _split_keys(value.lower() if isinstance(value, str) else value)


KeyList = Annotated[list[str], NoDecode]

DIGEST_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
# Keys travel in an HTTP header, which carries bytes Starlette reads as latin-1: printable ASCII
# (no spaces, no commas: those separate entries) is what arrives unchanged on every client.
_KEY_CHARS = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # "!" to "~" without ","
# The experiment trackers whose files a worker keeps inside the job's folder (worker/training/tracking.py);
# Accelerate's others write to the working directory or the home folder, so none may be served.
CONFINED_TRACKERS = ("tensorboard", "mlflow")


class _FromEnvironment(BaseSettings):
    # hide_input_in_errors: a bad setting is named, never echoed (keys, passwords in database URLs).
    model_config = SettingsConfigDict(env_prefix="GLUEJOBS_", extra="ignore", hide_input_in_errors=True)


class CommonSettings(_FromEnvironment):
    """What the API and the workers both read: the database, the store, the folders a job's data,
    models and caches are in, the lease the API checks and the workers renew, the trackers the workers
    serve and the API's checks hold jobs to."""

    database_url: str = Field(
        default=f"sqlite:///{DEFAULT_VAR_DIR / 'gluejobs.db'}",
        description="SQLAlchemy URL: sqlite:///path (embedded) or postgresql+psycopg://user@host/db",
    )
    artifacts_dir: Path = Field(default=DEFAULT_VAR_DIR / "artifacts", description="Job outputs go here")
    data_dir: Path = Field(
        default=DEFAULT_VAR_DIR / "data", description="train_file/validation_file/test_file resolve here"
    )
    glue_dir: Path | None = Field(
        default=None, description="A local GLUE copy in the original release layout (SST-2/train.tsv …)"
    )
    models_dir: Path = Field(default=DEFAULT_VAR_DIR / "models", description="Local model folders")
    cache_dir: Path = Field(
        default=DEFAULT_VAR_DIR / "cache",
        description="This machine's caches: tokenised datasets, uploaded files fetched from the store",
    )
    storage_url: str | None = Field(
        default=None,
        description="Where uploaded files, checkpoints, models, predictions and logs live: unset, the local "
        "folder GLUEJOBS_ARTIFACTS_DIR (one machine, or a shared disk); s3://bucket/prefix, any "
        "S3-compatible store, with the endpoint and credentials of the standard AWS environment and "
        "config (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID …)",
    )
    storage_retry_s: float = Field(
        default=300.0,
        gt=0,
        description="How long an operation on an unreachable store is retried (with backoff) before the "
        "attempt fails as storage_unreachable, which is retried as a new attempt",
    )
    lease_s: float = Field(default=60.0, gt=0, description="A running job's lease; renewed by heartbeats")
    trackers: KeyList = Field(
        default_factory=lambda: ["tensorboard"],
        description="Experiment trackers the workers serve (installed and configured on every worker); "
        "jobs asking for others are refused. Default: TensorBoard, which the worker extra installs",
    )

    @field_validator("storage_url")
    @classmethod
    def _storage_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        scheme, sep, rest = value.strip().partition("://")
        if scheme != "s3" or not sep or not rest.split("/")[0]:
            raise ValueError(
                "GLUEJOBS_STORAGE_URL takes s3://bucket/prefix (leave it unset for the local folder "
                "GLUEJOBS_ARTIFACTS_DIR)"
            )
        return f"s3://{rest.strip('/')}"

    @field_validator("trackers", mode="before")
    @classmethod
    def _parse_trackers(cls, value: object) -> object:
        return _split_names(value)

    @field_validator("trackers")
    @classmethod
    def _confined_trackers(cls, value: list[str]) -> list[str]:
        outside = [name for name in value if name not in CONFINED_TRACKERS]
        if outside:
            raise ValueError(
                f"GLUEJOBS_TRACKERS: {outside[0]!r} would write outside the job's folder on the workers; "
                f"gluejobs serves {', '.join(CONFINED_TRACKERS)}"
            )
        return value

    def job_dir(self, job_id: int) -> Path:
        """A job's folder (model, checkpoints, logs, predictions): the one the worker writes and the
        API serves, so both must see the same GLUEJOBS_ARTIFACTS_DIR."""
        return (self.artifacts_dir / "jobs" / str(job_id)).resolve()


class SchedulingSettings(_FromEnvironment):
    """A team's shared fleet (shared/scheduling/fair_share.py, shared/scheduling/quotas.py): read by
    the API's admission and by the workers' claims."""

    fair_share: bool = Field(
        default=True,
        description="A claim prefers the owner holding the fewest devices (weighted by their share), then "
        "priority, then age; off: priority, then age, for everyone",
    )
    max_user_priority: int = Field(
        default=100,
        ge=0,
        le=1000,
        description="The highest priority a non-admin key may set; admins may set up to 1000, and a "
        "priority above this one runs before fair share's order",
    )
    reservation_after_s: float = Field(
        default=600.0,
        ge=0,
        description="A job needing more devices than a worker has free, queued this long, reserves that "
        "worker: narrower jobs no longer take its devices until the wide job has started",
    )
    default_max_devices: int | None = Field(
        default=None,
        ge=1,
        description="Devices one owner may hold at once (none: no limit); admins set "
        "per-owner quotas over the API",
    )
    default_max_queued: int | None = Field(
        default=1000, ge=1, description="Queued jobs one owner may have; a submission over it gets 429"
    )
    default_max_device_hours_per_day: float | None = Field(
        default=None, gt=0, description="Device-hours one owner may use in any 24 hours (none: no limit)"
    )
    default_max_storage_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Bytes one owner may hold in the store (files, models, checkpoints, job outputs; none: "
        "no limit): uploads past it get 429, and the owner's queued jobs wait until it is under it again",
    )


class WorkerSettings(_FromEnvironment):
    """Read by the workers alone (worker/fleet, and the training loop's meter and disk check)."""

    heartbeat_s: float = Field(default=5.0, gt=0, description="How often a worker renews its lease")
    poll_interval_s: float = Field(default=2.0, gt=0, description="How often an idle worker looks for work")
    # A checkpoint that cannot be written fails its attempt; a worker that keeps claiming on a full
    # disk fails every job it takes (issue 34). Below the floor it claims nothing until it has room.
    worker_min_free_bytes: int = Field(
        default=1024**3,
        ge=0,
        description="Free bytes a worker keeps on the disks of GLUEJOBS_ARTIFACTS_DIR and "
        "GLUEJOBS_CACHE_DIR: below it, it claims no job (state low_disk, /readyz 503) until it has room "
        "again; 0 turns the check off",
    )
    max_resource_handbacks: int = Field(
        default=3,
        ge=0,
        description="How often a job is handed back, without spending an attempt, because its worker ran "
        "out of disk or memory; past it the job fails (it needs more than the workers have)",
    )
    cancel_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="SIGTERM→SIGKILL grace for a job's child: on a worker's shutdown, the time it has to "
        "save a checkpoint at its next step boundary before the job is handed back",
    )
    retry_backoff_s: float = Field(
        default=30.0,
        ge=0,
        description="A job that failed for a reason outside itself is retried after this, doubled per "
        "attempt (capped by GLUEJOBS_RETRY_BACKOFF_MAX_S)",
    )
    retry_backoff_max_s: float = Field(default=1800.0, ge=0, description="The longest wait between attempts")
    device_lock_dir: Path = Field(
        default=Path("/tmp/gluejobs-devices"),
        description="Per-GPU lock files: two workers on one machine never hold the same GPU. Must be the "
        "same folder for every worker of a machine (a machine-wide path, not per checkout)",
    )
    warm_start: bool = Field(
        default=True,
        description="Fork single-process jobs from a template process with torch already imported "
        "(about a second from claim to first step) instead of starting a fresh interpreter",
    )
    # --- jobs of several machines (issue 37; worker/fleet/launch.py, shared/jobs_repo/gangs.py) ----
    # Rank 0 of a gang hosts the static rendezvous (torch's c10d TCPStore, then gloo/NCCL) on the
    # address it advertises and a port it reserves; every other member must reach that address.
    gang_address: str | None = Field(
        default=None,
        description="The address this worker advertises as rank 0 of a job of several machines (the "
        "others connect to it); unset: this host's address on the route to the database's host, or "
        "127.0.0.1 with SQLite (every worker on one machine)",
    )
    gang_ports: str | None = Field(
        default=None,
        pattern=r"^\s*\d{1,5}\s*-\s*\d{1,5}\s*$",
        description="FIRST-LAST: the ports rank 0 may reserve for a gang's rendezvous (open these between "
        "workers); unset: a free port below the system's ephemeral range",
    )
    gang_fill_s: float = Field(
        default=120.0,
        gt=0,
        description="How long rank 0 holds an open gang for the other machines to join; not full by then, "
        "the job goes back to the queue without spending an attempt",
    )
    peak_flops: float | None = Field(
        default=None,
        gt=0,
        description="The peak FLOP/s of one job process's device, for the model FLOP utilisation that each "
        "job's result reports; unset: a GPU's datasheet figure by name, a CPU's measured matmul rate",
    )


class ApiSettings(_FromEnvironment):
    """Read by the API alone: its keys, what one client may hold of it (service/edge/connections.py,
    service/edge/guard.py, service/edge/rate_limits.py), and its background work (the store's
    sweeps, the search driver)."""

    api_keys: KeyList = Field(
        default_factory=list,
        description="Bootstrap bearer keys, or sha256:<64 hex digits> digests of them; `alice=<key>` names "
        "the key's owner (else the owner is key-<first 12 hex digits of its digest>). More keys are "
        "made, rotated and revoked over the API (POST /v1/keys) and kept as hashes in the database",
    )
    admin_keys: KeyList = Field(
        default_factory=list,
        description="Bootstrap admin keys (or digests, `name=` as above): they see every owner's jobs and "
        "manage keys and quotas",
    )
    max_request_bytes: int = Field(default=1_048_576, gt=0, description="Larger request bodies get 413")
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="Open connections the API keeps at most; at the limit, a new connection closes the "
        "one that has waited longest for a request head (a slow or idle client), else it gets 503",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A connection that has not sent a whole request head this long is closed",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A request whose body has not all arrived this long after it began gets 408",
    )
    keep_alive_s: float = Field(
        default=5.0,
        gt=0,
        description="An idle keep-alive connection is closed after this (uvicorn's timeout_keep_alive)",
    )
    max_header_bytes: int = Field(
        default=16_384,
        ge=1024,
        description="The request line and headers together (h11's max_incomplete_event_size); more gets 400",
    )
    client_log_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="Slow, idle and broken clients are logged as one summary line per interval, not a "
        "line each",
    )
    allowed_hosts: KeyList = Field(
        default_factory=list,
        description="Host names (or `*.example.org`, or `*` for any) the API answers to besides its bound "
        "address and loopback names; other Host headers get 400 (DNS rebinding)",
    )
    allowed_origins: KeyList = Field(
        default_factory=list,
        description="Origins (`https://app.example.org`) besides the API's own that may send state-changing "
        "requests; a browser request from any other origin gets 403",
    )
    rate_submits_per_minute: int = Field(
        default=120,
        ge=0,
        description="Writes (submissions, cancels, uploads …) one key may make per "
        "minute, counted in the database for every API process; 0: no limit",
    )
    rate_reads_per_minute: int = Field(
        default=6000, ge=0, description="Reads one key may make per minute, on every API process; 0: no limit"
    )
    max_streams_per_key: int = Field(
        default=20,
        ge=0,
        description="Event streams one key may hold open across every API process; 0: no limit",
    )
    storage_presign_s: int = Field(
        default=0,
        ge=0,
        le=7 * 24 * 3600,
        description="With an S3 store: downloads of one file answer 307 with a presigned URL valid this "
        "long (the client fetches from the store itself); 0 streams every download through the API",
    )
    orphan_grace_s: float = Field(
        default=3600.0,
        ge=0,
        description="An object under files/ or models/ in the store that no uploaded file's or model's "
        "row holds is removed at "
        "the API's start once it is this old (an API that died between storing an upload's bytes and "
        "its row); younger ones may belong to an upload in flight",
    )
    checkpoint_retention_days: float | None = Field(
        default=None,
        gt=0,
        description="A finished job's checkpoints are removed this many days after it finished, but "
        "its final model and best checkpoint (none: kept until deleted)",
    )
    storage_sweep_s: float = Field(
        default=60.0,
        gt=0,
        description="How often each API process sizes new checkpoints and finished jobs' outputs for "
        "the owners' storage tally, finishes deletions a crash cut short and applies the retention",
    )
    search_driver: bool = Field(
        default=True,
        description="Drive hyperparameter searches from this API process (a background thread; several "
        "processes share the searches through a lease in the database)",
    )
    search_poll_s: float = Field(
        default=2.0, gt=0, description="How often the search driver reads its searches' new evaluations"
    )
    search_lease_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a search driver holds a search without renewing it before another API "
        "process takes it over",
    )

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: object) -> object:
        return _split_keys(value)

    @field_validator("api_keys", "admin_keys")
    @classmethod
    def _valid_keys(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for position, entry in enumerate(value, start=1):
            try:
                configured_key_digest(entry)
            except ValueError as exc:
                # The entry by its position, never its text: it may be a secret.
                raise ValueError(f"GLUEJOBS_{str(info.field_name).upper()} entry {position}: {exc}") from None
        return value

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _parse_names(cls, value: object) -> object:
        return _split_names(value)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys or self.admin_keys)


class DataLimitSettings(_FromEnvironment):
    """Read by the API alone: what it reads of the data and models that jobs name, uploads and dry
    runs (shared/data/limits.py, shared/admission, service/files, service/dry_run)."""

    max_upload_bytes: int = Field(
        default=2 * 1024**3, gt=0, description="POST /v1/files: larger uploads get 413, nothing kept"
    )
    # The shape of any data file the API reads (uploads, dry runs, submissions): checked before its
    # cells are decoded (shared/data/limits.py), so a small file cannot unfold into gigabytes.
    file_max_columns: int = Field(
        default=100, ge=1, description="Columns a data file may have; wider files get 422"
    )
    file_max_cell_bytes: int = Field(
        default=64 * 1024, ge=1, description="Bytes in one cell of a data file (a sentence); more: 422"
    )
    file_max_row_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        description="Bytes in one row (one line, one JSON record) of a data file, the header included; "
        "more: 422",
    )
    file_max_row_group_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1,
        description="A parquet row group's size once read (its uncompressed bytes plus 8 per cell), from "
        "its metadata, before any page is decoded; more: 422",
    )
    file_max_text_bytes: int = Field(
        default=2 * 1024**3,
        ge=1,
        description="Bytes of cells in a whole data file once decoded (a parquet file's strings, a text "
        "file's bytes); more: 422",
    )
    max_file_checks: int = Field(
        default=2,
        ge=1,
        description="Uploads checked at once, each in a child process; more get 429 with Retry-After",
    )
    # Files under GLUEJOBS_DATA_DIR or GLUEJOBS_GLUE_DIR are read in the API process by a submission's
    # and a dry run's checks (an upload's were checked in a child when it arrived): their size bounds
    # that memory (a few times the file), and at most max_file_checks such reads run at once.
    max_checked_data_bytes: int = Field(
        default=128 * 1024**2,
        ge=1,
        description="A data-folder or GLUE file the API reads for a submission's or dry run's checks; a "
        "larger one is not read by the API (the submission says so in its warnings and the worker checks "
        "it; a dry run answers 422)",
    )
    file_check_memory_bytes: int = Field(
        default=1024**3,
        ge=64 * 1024 * 1024,
        description="Address space an upload's check may add to its child process (RLIMIT_AS); past it: 422",
    )
    file_check_cpu_s: int = Field(
        default=120, ge=1, description="CPU seconds an upload's check may take (RLIMIT_CPU); past it: 422"
    )
    max_model_bytes: int = Field(
        default=8 * 1024**3,
        gt=0,
        description="POST /v1/models: a model folder's files together (as a tar); larger ones get 413",
    )
    max_model_parameters: int = Field(
        default=10_000_000_000,
        gt=0,
        description="A model whose config.json declares a shape of more parameters than this (an "
        "estimate from its sizes) is refused at upload, at submit and by the dry run",
    )
    check_data_on_submit: bool = Field(
        default=True,
        description="Read a job's data at submission and refuse (422) what would fail it on a worker; turn "
        "off for an API that cannot see GLUEJOBS_DATA_DIR/GLUEJOBS_GLUE_DIR (the dry run still reads them)",
    )
    hub_check_timeout_s: float = Field(
        default=3.0,
        ge=0,
        le=60,
        description="At submission, a Hub model id that is not in the Hub cache (HF_HUB_CACHE) is looked up "
        "on the Hub (HF_ENDPOINT) for at most this long; 0 or no network: the job is accepted with a "
        "warning that its model could not be checked; HF_HUB_OFFLINE=1 (offline by configuration): "
        "refused, naming the model",
    )
    max_dry_runs: int = Field(
        default=2,
        ge=1,
        description="Dry runs (they read and tokenise data inside the API) at once; more get 429 with "
        "Retry-After",
    )
    # A dry run's tokenizer is the model's (a registered model's: the owner's file, regexes and all); it
    # runs in a child process under these limits (service/dry_run/tokenizer_child.py). A normal
    # tokenizer measures a dry run's 5,000-row samples in well under a second of CPU and ~100 MB.
    dry_run_tokenizer_memory_bytes: int = Field(
        default=1024**3,
        ge=64 * 1024 * 1024,
        description="Address space a dry run's tokenizer may add to its child process (RLIMIT_AS); past "
        "it: 422",
    )
    dry_run_tokenizer_cpu_s: int = Field(
        default=20, ge=1, description="CPU seconds a dry run's tokenizer may take (RLIMIT_CPU); past it: 422"
    )
    dry_run_tokenizer_deadline_s: float = Field(
        default=30.0,
        gt=0,
        description="Wall-clock seconds a dry run's tokenizer may take, its child's start included; past "
        "it: 422",
    )


class WebhookSettings(_FromEnvironment):
    """Read by the API alone: its webhooks' registration and delivery (shared/webhooks,
    service/background/webhook_dispatcher.py)."""

    webhook_allowed_hosts: KeyList = Field(
        default_factory=list,
        description="Host names, addresses or networks (`hooks.internal`, `127.0.0.1`, `10.0.0.0/8`) that "
        "webhooks may reach although they are loopback, private, link-local or otherwise not public; "
        "every other such address is refused at registration and at delivery (SSRF)",
    )
    webhook_dispatch: bool = Field(
        default=True, description="This API process sends webhook deliveries (off: another process does)"
    )
    webhook_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=60,
        description="One delivery attempt's overall deadline: resolving, connecting, sending, the "
        "answer's headers and its first bytes together",
    )
    webhook_max_attempts: int = Field(
        default=8, ge=1, le=50, description="Attempts per delivery before it is marked failed"
    )
    webhook_backoff_s: float = Field(
        default=10.0, ge=0, description="The wait before a delivery's second attempt; doubled after each"
    )
    webhook_backoff_max_s: float = Field(
        default=3600.0, ge=0, description="The longest wait between a delivery's attempts"
    )
    webhook_concurrency: int = Field(
        default=8, ge=1, le=256, description="Deliveries one API process sends at once"
    )
    webhook_endpoint_concurrency: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Deliveries to one endpoint in flight at once, across every API process: a slow or "
        "dead receiver holds up only its own deliveries",
    )
    webhook_owner_concurrency: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Deliveries to one owner's endpoints in flight at once, across every API process",
    )
    webhook_poll_s: float = Field(
        default=1.0, gt=0, description="How often the dispatcher looks for due deliveries"
    )

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _parse_hosts(cls, value: object) -> object:
        return _split_keys(value)


# Every group, in the order the configuration page shows them.
SETTING_GROUPS: tuple[type[_FromEnvironment], ...] = (
    CommonSettings,
    SchedulingSettings,
    WorkerSettings,
    ApiSettings,
    DataLimitSettings,
    WebhookSettings,
)


class Settings(
    WebhookSettings, DataLimitSettings, ApiSettings, WorkerSettings, SchedulingSettings, CommonSettings
):
    """Every setting: the one object the API and the workers build (pydantic collects the groups'
    fields from the last base to the first, so `model_fields` lists them in SETTING_GROUPS' order)."""

    @model_validator(mode="after")
    def _heartbeat_below_lease(self) -> Settings:
        # Here, where the two meet: the lease is everyone's, the heartbeat the workers'.
        if self.heartbeat_s >= self.lease_s:
            raise ValueError(
                f"GLUEJOBS_HEARTBEAT_S ({self.heartbeat_s}) must be shorter than GLUEJOBS_LEASE_S "
                f"({self.lease_s}), or every lease would expire between two heartbeats"
            )
        return self


def secret_digest(secret: str) -> str:
    """The sha256 hex digest of a key. A key presented by a client always goes through here, so
    a client that sends `sha256:<hex>` sends a key like any other (the digest of that string)."""
    return hashlib.sha256(secret.encode()).hexdigest()


# `alice=<key>`: an owner's name, then the key. A key may itself hold "=" (base64's padding): only a
# leading valid name followed by "=" and something other than "=" names an owner.
OWNER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAMED_ENTRY = re.compile(r"(?P<owner>[A-Za-z0-9][A-Za-z0-9._-]{0,63})=(?P<key>[^=].*)", re.DOTALL)


def split_owner(entry: str) -> tuple[str | None, str]:
    """A configured entry's owner name (None when it names none) and its key or digest."""
    named = _NAMED_ENTRY.fullmatch(entry)
    if named is None:
        return None, entry
    return named["owner"], named["key"]


def configured_key_digest(entry: str) -> str:
    """The digest a configured entry stands for: a `sha256:<64 hex digits>` entry is one already,
    anything else is a key; either may follow `owner=`. Only the configuration may hold digests.

    Error messages never quote the entry: it may be a secret.
    """
    entry = split_owner(entry)[1]
    if entry.startswith(DIGEST_PREFIX):
        digest = entry.removeprefix(DIGEST_PREFIX)
        if not _HEX_DIGEST.fullmatch(digest):
            raise ValueError(f"it starts with {DIGEST_PREFIX} but is not followed by exactly 64 hex digits")
        return digest.lower()
    if not _KEY_CHARS.fullmatch(entry):
        raise ValueError("a key is printable ASCII without spaces or commas")
    return secret_digest(entry)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
