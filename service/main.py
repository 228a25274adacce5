"""The gluejobs API: create_app(settings) mounts the routers; nothing here imports torch."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, FastAPI, Request, Response

from service.errors import error_response, install_error_handlers
from service.routes import health, jobs, leaderboard, submissions, sweeps
from shared.config import Settings, get_settings
from shared.db import Database


def create_app(settings: Settings | None = None, db: Database | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="gluejobs",
        version="0.1.0",
        summary="Fine-tuning jobs for GLUE-style classification and regression, as a REST service",
    )
    app.state.settings = settings
    app.state.db = db or Database(settings.database_url)
    install_error_handlers(app)

    @app.middleware("http")
    async def limit_body_size(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_request_bytes:
            return error_response(
                413, "request_too_large", f"request body is larger than {settings.max_request_bytes} bytes"
            )
        return await call_next(request)

    v1 = APIRouter(prefix="/v1")
    v1.include_router(jobs.router)
    v1.include_router(sweeps.router)
    v1.include_router(leaderboard.router)
    v1.include_router(submissions.router)
    app.include_router(v1)
    app.include_router(health.router)
    return app
