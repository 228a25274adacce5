"""Every read and write of jobs and their rows, each in its own short transaction.

Functions are keyword-only and small; routes and workers never commit themselves. Writes that
the same job can repeat after a crash (metrics, checkpoints) are idempotent. Every write a worker
or a job's process makes carries its claim (claims.py) and changes nothing once the claim is stale;
every status change is written with its event (events.py).

One module per caller, all behind this one (`from shared import jobs_repo; jobs_repo.create_job`):
jobs (the API's job routes), files (uploaded files), sweeps (sweeps and the leaderboard), queue (the
workers), reports (a job's process), streams (the API's cursors and live stream), workers (worker
registration and GET /v1/workers).
"""

from shared.jobs_repo.claims import Claim
from shared.jobs_repo.events import CHECKPOINT, LOG, STATE
from shared.jobs_repo.files import (
    NewFile,
    add_file,
    delete_file,
    find_file,
    get_file,
    list_files,
    public_id,
    recheck_file,
    row_id,
)
from shared.jobs_repo.jobs import (
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_KEY_TTL_S,
    create_job,
    create_job_once,
    find_job,
    get_job,
    list_jobs,
    prune_job,
    request_cancel,
)
from shared.jobs_repo.models import NewModel, add_model, delete_model, get_model, has_model, list_models
from shared.jobs_repo.queue import (
    ExpiredLease,
    claim_next,
    fail_job,
    finish_job,
    hand_back_job,
    heartbeat,
    queued_wider_than,
    recover_expired_leases,
    release_job,
    resource_handbacks,
    retry_pending,
    set_output_dir,
)
from shared.jobs_repo.reports import (
    MetricRow,
    add_checkpoint,
    add_event,
    add_metrics,
    delete_checkpoints,
    set_environment,
    set_result,
)
from shared.jobs_repo.streams import (
    NOTIFY_CHANNEL,
    CursorPage,
    StreamPage,
    cursor_page,
    list_checkpoints,
    list_events,
    list_metrics,
    notify_rows,
    read_stream_page,
    stream_statement,
)
from shared.jobs_repo.sweeps import (
    SweepJob,
    cancel_sweep,
    create_sweep,
    get_sweep,
    get_sweeps,
    list_eval_metrics,
    list_finished_jobs,
    list_sweep_jobs,
    list_sweeps,
)
from shared.jobs_repo.workers import (
    WORKER_RETENTION_S,
    WorkerView,
    list_workers,
    prune_workers,
    register_worker,
    touch_worker,
    worker_stopped,
)

__all__ = [
    "CHECKPOINT",
    "IDEMPOTENCY_HEADER",
    "IDEMPOTENCY_KEY_TTL_S",
    "LOG",
    "NOTIFY_CHANNEL",
    "STATE",
    "WORKER_RETENTION_S",
    "Claim",
    "CursorPage",
    "ExpiredLease",
    "MetricRow",
    "NewFile",
    "NewModel",
    "StreamPage",
    "SweepJob",
    "WorkerView",
    "add_checkpoint",
    "add_event",
    "add_file",
    "add_metrics",
    "add_model",
    "cancel_sweep",
    "claim_next",
    "create_job",
    "create_job_once",
    "create_sweep",
    "cursor_page",
    "delete_checkpoints",
    "delete_file",
    "delete_model",
    "fail_job",
    "find_file",
    "find_job",
    "finish_job",
    "get_file",
    "get_job",
    "get_model",
    "get_sweep",
    "get_sweeps",
    "hand_back_job",
    "has_model",
    "heartbeat",
    "list_checkpoints",
    "list_eval_metrics",
    "list_events",
    "list_files",
    "list_finished_jobs",
    "list_jobs",
    "list_metrics",
    "list_models",
    "list_sweep_jobs",
    "list_sweeps",
    "list_workers",
    "notify_rows",
    "prune_job",
    "prune_workers",
    "public_id",
    "queued_wider_than",
    "read_stream_page",
    "recheck_file",
    "recover_expired_leases",
    "register_worker",
    "release_job",
    "request_cancel",
    "resource_handbacks",
    "retry_pending",
    "row_id",
    "set_environment",
    "set_output_dir",
    "set_result",
    "stream_statement",
    "touch_worker",
    "worker_stopped",
]
