"""/v1/workers: the fleet, as the workers report themselves.

Every key sees every worker (a shared resource: which machines are up, busy or gone is what a user
needs to know why their job waits); the jobs listed under a worker are only the caller's own,
unless the caller is an admin (or auth is off).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.deps import PrincipalDep, SessionDep, SettingsDep
from service.schemas.workers import WorkersPublic
from shared import jobs_repo

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", response_model=WorkersPublic)
def read_workers(session: SessionDep, settings: SettingsDep, principal: PrincipalDep) -> dict[str, Any]:
    """Workers heard from in the last day, newest first: host, pid, devices, version (release+build),
    build (release, code hash, commit, schema head and the spec fields it supports), state (idle,
    busy, draining, stopped, or gone once a lease passed without a heartbeat) and current jobs."""
    workers = jobs_repo.list_workers(session, lease_s=settings.lease_s, owner=principal.owner_filter)
    return {"data": workers}
