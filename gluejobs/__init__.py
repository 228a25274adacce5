"""gluejobs for its users: the Python client (`from gluejobs import Client`) and the command line.

Importing this package loads httpx and the standard library only (with shared/wire's words, the
statuses and event types the API spells, standard library too): no pydantic, no FastAPI, no torch.
"""

from gluejobs.client import (
    TERMINAL_STATUSES,
    ApiError,
    ApiKeyInfo,
    Artifact,
    AsyncClient,
    AuditEntry,
    Checkpoint,
    Client,
    Event,
    Job,
    Metric,
    ModelInfo,
    OwnerInfo,
    Plan,
    Problem,
    Search,
    StreamEvent,
    Sweep,
    SweepPlan,
    TaskLeaderboard,
    Webhook,
    WebhookDelivery,
    WorkerInfo,
)

__all__ = [
    "TERMINAL_STATUSES",
    "ApiError",
    "ApiKeyInfo",
    "Artifact",
    "AsyncClient",
    "AuditEntry",
    "Checkpoint",
    "Client",
    "Event",
    "Job",
    "Metric",
    "ModelInfo",
    "OwnerInfo",
    "Plan",
    "Problem",
    "Search",
    "StreamEvent",
    "Sweep",
    "SweepPlan",
    "TaskLeaderboard",
    "Webhook",
    "WebhookDelivery",
    "WorkerInfo",
]
