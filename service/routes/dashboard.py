"""GET /: the dashboard, and GET /docs: Swagger UI. Plain HTML, JavaScript and CSS from service/static
(no build step), with uPlot and Swagger UI vendored under static/vendor (versions and licences
beside them): nothing is fetched from the network at run time. The dashboard reads the same /v1 API
as any client, with the user's key.

The job statuses the dashboard's scripts know (STATUSES, TERMINAL) are not written in them: GET
/wire.js declares them from shared/wire/vocabulary.py, the module the database's enum and the client
read, so the page cannot drift from either. Served rather than checked by a test: the page then
needs no copy at all, and a status added is on the page with nothing else to edit.

Both pages are served with a Content-Security-Policy that allows scripts, styles and connections to
this origin only, and no framing: a script injected through a job's name or a log line could not
run, load anything or send anything elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from shared.wire.vocabulary import TERMINAL_STATUSES, JobStatus

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",  # the empty favicon, Swagger UI's icons
        "font-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
PAGE_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Referrer-Policy": "no-referrer"}

router = APIRouter(include_in_schema=False)


def wire_script() -> str:
    """The dashboard's constants shared with the server (loaded before its other scripts)."""
    statuses = [status.value for status in JobStatus]
    terminal = [status for status in statuses if status in TERMINAL_STATUSES]
    return (
        "/* Written by the API from shared/wire/vocabulary.py (service/routes/dashboard.py). */\n"
        '"use strict";\n'
        f"const STATUSES = {json.dumps(statuses)};\n"
        f"const TERMINAL = new Set({json.dumps(terminal)});\n"
    )


WIRE_SCRIPT = wire_script()


@router.get("/")
def dashboard() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=PAGE_HEADERS)


@router.get("/wire.js")
def wire() -> Response:
    return Response(WIRE_SCRIPT, media_type="text/javascript")


@router.get("/docs")
def docs() -> FileResponse:
    return FileResponse(STATIC_DIR / "docs.html", media_type="text/html", headers=PAGE_HEADERS)


def mount_static(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
