"""`gluejobs serve` / `python -m service`: migrate the database, then serve the API with uvicorn; an
API whose release does not fit the database refuses to start with one line (shared/core/release.py).

Without GLUEJOBS_API_KEYS (or GLUEJOBS_ADMIN_KEYS) the API serves anyone who can reach it, so it
binds to 127.0.0.1 by default, and binding to any other address without keys takes an explicit
`--insecure-no-auth`.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import resource
from typing import Any

from shared.core import release
from shared.core.config import Settings, get_settings
from shared.core.db import Database
from shared.core.migrate import upgrade
from shared.core.storage import open_store

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
    result.add_argument(
        "--no-migrate",
        action="store_true",
        help="leave the schema as it is (run `gluejobs migrate` yourself); refuse to serve unless it fits",
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

    db = Database(settings.database_url)
    try:
        if args.no_migrate:
            with db.engine.connect() as connection:
                release.check(connection)
        else:
            upgrade(db)
    except release.ReleaseMismatch as exc:
        raise SystemExit(f"{prog}: {exc}") from None  # one line, no traceback
    open_store(settings).check()  # the store's bucket or folder, made when missing
    serve(settings, db, host=args.host, port=args.port)
    return 0


# Descriptors the API needs besides its client connections: database connections, data and
# artifact files it reads, log files, the listening socket.
RESERVED_DESCRIPTORS = 256


def connection_limit(settings: Settings) -> int:
    """GLUEJOBS_MAX_CONNECTIONS, lowered to what the process may open. The soft RLIMIT_NOFILE is raised
    towards the hard one first: its usual 1024 is a leftover of select(), which asyncio does not use."""
    wanted = settings.max_connections + RESERVED_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < wanted:
        limit = max(1, soft - RESERVED_DESCRIPTORS)
        logger.warning(
            "GLUEJOBS_MAX_CONNECTIONS %d lowered to %d: the process may open %d files (ulimit -n)",
            settings.max_connections,
            limit,
            soft,
        )
        return limit
    return settings.max_connections


def uvicorn_config(settings: Settings, db: Database, *, host: str, port: int, **options: Any) -> Any:
    """uvicorn's configuration for the API: its own limits, plus the connection guard's protocol."""
    import uvicorn

    from service.edge.connections import (
        ClientEventLog,
        ConnectionLimits,
        guarded_protocol,
        install_log_filters,
    )
    from service.error_log import install_bounded_lines
    from service.main import create_app

    limits = ConnectionLimits(
        max_connections=connection_limit(settings),
        header_timeout_s=settings.header_timeout_s,
        log_interval_s=settings.client_log_interval_s,
    )
    events = ClientEventLog(limits)
    config = uvicorn.Config(
        create_app(settings, db, host=host),
        host=host,
        port=port,
        http=guarded_protocol(limits, events),
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]  # used as a float (call_later)
        h11_max_incomplete_event_size=settings.max_header_bytes,
        # No limit_concurrency: it answers 503 to every request once the *connections* reach it, which
        # lets slow clients shut everyone out; the protocol bounds connections without that flaw.
        **options,
    )
    install_log_filters(events)  # after uvicorn.Config, which configures logging
    install_bounded_lines("uvicorn", "uvicorn.access")
    return config


def serve(settings: Settings, db: Database, *, host: str, port: int) -> None:
    import uvicorn

    uvicorn.Server(uvicorn_config(settings, db, host=host, port=port, log_level="info")).run()
