"""`gluejobs serve` / `python -m service`: migrate the database, then serve the API with uvicorn."""

from __future__ import annotations

import argparse
import logging

from shared.config import get_settings
from shared.db import Database
from shared.migrate import upgrade

logger = logging.getLogger(__name__)


def parser(prog: str = "gluejobs serve") -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog=prog, description="Run the HTTP API (migrates the database first).")
    result.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    result.add_argument("--port", type=int, default=8000)
    return result


def main(argv: list[str] | None = None, *, prog: str = "gluejobs serve") -> int:
    import uvicorn

    from service.main import create_app

    args = parser(prog).parse_args(argv)
    settings = get_settings()
    db = Database(settings.database_url)
    upgrade(db)
    uvicorn.run(create_app(settings, db), host=args.host, port=args.port, log_level="info")
    return 0
