"""GET /: the dashboard. Plain HTML, JavaScript and CSS from service/static (no build step), with
uPlot vendored under static/vendor (its version and licence beside it): nothing is fetched from
the network at run time. The page reads the same /v1 API as any client, with the user's key."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(include_in_schema=False)


@router.get("/")
def dashboard() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


def mount_static(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
