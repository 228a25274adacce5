"""GET /: the dashboard, and GET /docs: Swagger UI. Plain HTML, JavaScript and CSS from service/static
(no build step), with uPlot and Swagger UI vendored under static/vendor (versions and licences
beside them): nothing is fetched from the network at run time. The dashboard reads the same /v1 API
as any client, with the user's key.

Both pages are served with a Content-Security-Policy that allows scripts, styles and connections to
this origin only, and no framing: a script injected through a job's name or a log line could not
run, load anything or send anything elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

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


@router.get("/")
def dashboard() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=PAGE_HEADERS)


@router.get("/docs")
def docs() -> FileResponse:
    return FileResponse(STATIC_DIR / "docs.html", media_type="text/html", headers=PAGE_HEADERS)


def mount_static(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
