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
import multiprocessing
import resource
from multiprocessing.connection import Connection
from typing import Any

from shared.core import release
from shared.core.config import Settings, get_settings
from shared.core.db import Database
from shared.core.migrate import upgrade

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

    schema = SchemaCheck(settings.database_url, check_only=args.no_migrate)
    import_the_api()  # meanwhile
    refusal = schema.result()
    if refusal is not None:
        raise SystemExit(f"{prog}: {refusal}")  # one line, no traceback
    # The store's bucket or folder is made when missing and swept once the API serves
    # (service/main.store_chores): neither holds its readiness.
    serve(settings, Database(settings.database_url), host=args.host, port=args.port)
    return 0


class SchemaCheck:
    """`gluejobs serve`'s migration (or, with --no-migrate, its check that the schema fits), in a
    process of its own forked at start, while this one imports the API: the two were most of a
    start's CPU time, one after the other (bench/api_startup.py). The child reads Alembic and the
    migration files; it tells this process the schema's head and known revisions, so that the API
    (its /readyz) never imports Alembic. Forked before this process has a thread."""

    def __init__(self, url: str, *, check_only: bool) -> None:
        context = multiprocessing.get_context("fork")
        self._answers, answer = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_check_schema, args=(url, check_only, answer), name="gluejobs-schema", daemon=True
        )
        self._process.start()
        answer.close()

    def result(self) -> str | None:
        """None once the schema fits this release; else the one line that says why it does not."""
        try:
            outcome = self._answers.recv()
        except EOFError:  # it died without a word (killed)
            outcome = ("failed", f"the schema check's process ended with status {self._process.exitcode}")
        finally:
            self._process.join()
            self._answers.close()
        if outcome[0] == "fits":
            release.told(outcome[1], frozenset(outcome[2]))
            return None
        return str(outcome[1])


def _check_schema(url: str, check_only: bool, answer: Connection) -> None:
    db = Database(url)
    try:
        if check_only:
            with db.engine.connect() as connection:
                release.check(connection)
        else:
            upgrade(db)
        head = release.schema_head()
        answer.send(("fits", head, sorted(release.known_revisions(head))))
    except release.ReleaseMismatch as exc:
        answer.send(("refused", str(exc)))
    except Exception as exc:
        # The driver's text names the database's host and user: for the operator who runs serve.
        logger.error("could not bring the database's schema up to date", exc_info=True)
        answer.send(("failed", f"could not bring the database's schema up to date ({type(exc).__name__})"))
    finally:
        answer.close()
        db.dispose()


def import_the_api() -> None:
    """The API's modules (most of a start: FastAPI, pydantic models, SQLAlchemy tables, pandas)."""
    import uvicorn  # noqa: F401

    import service.edge.connections
    import service.main  # noqa: F401


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
