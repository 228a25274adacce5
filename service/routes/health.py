"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from service.deps import get_database
from service.outage import RETRY_AFTER_S
from service.schemas import Health
from shared.migrate import is_up_to_date

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request) -> JSONResponse:
    """The database answers and its schema is current (503 otherwise)."""
    db = get_database(request)
    try:
        with db.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
            current = is_up_to_date(connection)
    except Exception as exc:  # any failure to reach the database means "not ready"
        # The error's text names the database's host and user: the server log has it, not the answer.
        body = Health(
            status="unavailable", database=db.dialect, detail=f"database unreachable ({type(exc).__name__})"
        )
        return JSONResponse(body.model_dump(), status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
    if not current:
        body = Health(status="unavailable", database=db.dialect, detail="database schema is not migrated")
        return JSONResponse(body.model_dump(), status_code=503)
    return JSONResponse(Health(status="ok", database=db.dialect).model_dump())
