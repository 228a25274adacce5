"""`gluejobs serve` / `python -m service`: migrate the database, then serve the API with uvicorn.

Without GLUEJOBS_API_KEYS (or GLUEJOBS_ADMIN_KEYS) the API serves anyone who can reach it, so it
binds to 127.0.0.1 by default, and binding to any other address without keys takes an explicit
`--insecure-no-auth`.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging

from shared.config import Settings, get_settings
from shared.db import Database
from shared.migrate import upgrade

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
INSECURE_FLAG = "--insecure-no-auth"


def parser(prog: str = "gluejobs serve") -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog=prog, description="Run the HTTP API (migrates the database first).")
    result.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    result.add_argument("--port", type=int, default=8000)
    result.add_argument(
        INSECURE_FLAG,
        action="store_true",
        help="serve on an address other than loopback without API keys (anyone who can reach it can "
        "submit, read and cancel every job)",
    )
    return result


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host`. Other host names count as reachable from outside:
    what they resolve to can change."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings, host: str, *, insecure_no_auth: bool) -> str | None:
    """Why serving on `host` must be refused, or None; logs whether keys are set either way."""
    if settings.auth_enabled:
        logger.info(
            "API keys are set (%d key(s), %d admin key(s)): /v1 needs Authorization: Bearer <key>",
            len(settings.api_keys),
            len(settings.admin_keys),
        )
        return None
    if is_loopback(host):
        logger.warning(
            "no API keys are set (GLUEJOBS_API_KEYS, GLUEJOBS_ADMIN_KEYS): anyone on this machine can use "
            "the API on %s",
            host,
        )
        return None
    if not insecure_no_auth:
        return (
            f"refusing to serve on {host} without API keys: anyone who can reach it could submit, read "
            f"and cancel every job. Set GLUEJOBS_API_KEYS (and GLUEJOBS_ADMIN_KEYS), bind to {DEFAULT_HOST}, "
            f"or pass {INSECURE_FLAG} if the network itself is trusted."
        )
    logger.warning(
        "%s: serving on %s WITHOUT API keys: anyone who can reach it can submit, read and cancel every job",
        INSECURE_FLAG,
        host,
    )
    return None


def main(argv: list[str] | None = None, *, prog: str = "gluejobs serve") -> int:
    arguments = parser(prog)
    args = arguments.parse_args(argv)
    settings = get_settings()
    refusal = check_exposure(settings, args.host, insecure_no_auth=args.insecure_no_auth)
    if refusal:
        arguments.error(refusal)  # exits with status 2

    import uvicorn

    from service.main import create_app

    db = Database(settings.database_url)
    upgrade(db)
    uvicorn.run(create_app(settings, db), host=args.host, port=args.port, log_level="info")
    return 0
