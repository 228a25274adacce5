"""gluejobs for its users: the Python client (`from gluejobs import Client`) and the command line.

Importing this package loads httpx and the standard library only: no pydantic, no FastAPI, no torch.
"""

from gluejobs.client import (
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
