"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.deps import get_database
from service.edge.outage import RETRY_AFTER_S
from service.schemas.common import Health
from shared.core import release
from shared.core.migrate import is_migrating

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request) -> JSONResponse:
    """200 `ok`: the database answers and this release fits its schema. Otherwise 503 with a status
    that says what to wait for: `database_unreachable` (this probe's round trip to the database
    failed), `warming_up` (it answers, but its schema is not yet this release's: being migrated, or
    waiting for `gluejobs migrate`), or `incompatible` (it was migrated for a release this one does
    not fit: no retry helps). The same words as a worker's health port (worker/fleet/health.py)."""
    db = get_database(request)
    try:
        with db.engine.connect() as connection:
            reason = release.misfit(connection)
            current = release.current_revision(connection)
        migrating = reason is not None and is_migrating(db)
    except Exception as exc:  # any failure to reach the database means "not ready"
        # The error's text names the database's host and user: the server log has it, not the answer.
        return _unready("database_unreachable", db.dialect, f"database unreachable ({type(exc).__name__})")
    if reason is None:
        return JSONResponse(Health(status="ok", database=db.dialect).model_dump())
    head = release.schema_head()
    behind = current is None or (current != head and current in release.known_revisions(head))
    if behind:  # this release's schema is yet to come
        if migrating:
            return _unready("warming_up", db.dialect, f"the database schema is being migrated to {head}")
        return _unready("warming_up", db.dialect, f"database schema is not migrated: {reason}")
    return _unready("incompatible", db.dialect, reason, retry=False)


def _unready(status: str, database: str, detail: str, *, retry: bool = True) -> JSONResponse:
    body = Health(status=status, database=database, detail=detail)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else None
    return JSONResponse(body.model_dump(), status_code=503, headers=headers)
