"""GET /metrics: Prometheus text format, every figure read from the database at scrape time."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from service.deps import PrincipalDep
from service.prometheus import registry_for
from service.schemas.common import ErrorResponse

router = APIRouter(tags=["monitoring"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"},
        401: {"model": ErrorResponse, "description": "API keys are configured: a scrape needs one"},
    },
)
def read_prometheus_metrics(request: Request, principal: PrincipalDep) -> Response:
    """Jobs by status, the queue, claims, job and epoch durations, failures by error code, workers
    by state with their heartbeat age, and running jobs' training throughput (names `gluejobs_*`).

    Correct behind several API processes: nothing is counted in the process. With API keys
    configured, a scrape needs one (Prometheus: `authorization: {credentials: <key>}`) and counts
    against its rate limit as any request does. An admin key sees the whole fleet, per job; any other
    key sees only its owner's jobs (summed, no job ids) and no workers.
    """
    registry: CollectorRegistry
    if principal.is_admin:
        registry = request.app.state.prometheus
    else:
        settings = request.app.state.settings
        registry = registry_for(
            request.app.state.db, lease_s=settings.lease_s, per_job=False, owner=principal.owner
        )
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
