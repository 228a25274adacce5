"""serve, worker, migrate, demo: the service's own parts, as commands of the client's `gluejobs`.

gluejobs-server declares them as "gluejobs.commands" entry points (server/pyproject.toml), which
gluejobs/cli/server_parts.py finds when it is installed. Each imports service/, worker/ or shared/'s
database only when it runs: `gluejobs serve` never loads torch, and a client command loads none of
them. On an API box (gluejobs-server without its worker extra), `gluejobs worker` says in one line what
to install.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import click

from gluejobs.cli.base import CliError, Command

# What each of the service's commands needs, and the line that installs it: the worker's training
# stack is gluejobs-server's extra, so an API box lacks it (the others come with gluejobs-server).
NEEDS = {
    "serve": (("service", "shared", "fastapi"), "pip install gluejobs-server"),
    "migrate": (("shared", "alembic", "sqlalchemy"), "pip install gluejobs-server"),
    "worker": (
        ("worker", "shared", "torch", "transformers"),
        'pip install "gluejobs-server[worker]" (docs/operators/install.md: CPU or CUDA torch)',
    ),
}
# serve's and worker's flags (--help too) are service/'s and worker/'s parsers': handed over whole.
FORWARDED = {"ignore_unknown_options": True, "help_option_names": []}


def _need_server(command: str) -> None:
    """One line saying what to install when this machine lacks what `command` runs."""
    modules, line = NEEDS[command]
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise CliError(f"this machine lacks what `gluejobs {command}` runs ({', '.join(missing)}): {line}")


@click.command("serve", cls=Command, context_settings=FORWARDED)
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def serve(flags: tuple[str, ...]) -> int:
    """Run the HTTP API (its flags: `gluejobs serve --help`).

    The database is migrated first, unless --no-migrate."""
    _need_server("serve")
    from service.server import main as serve_api

    return serve_api(list(flags))


@click.command("worker", cls=Command, context_settings=FORWARDED)
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def worker(flags: tuple[str, ...]) -> int:
    """Claim and run jobs (its flags: `gluejobs worker --help`).

    The database is migrated first, unless --no-migrate."""
    _need_server("worker")
    from worker.fleet.main import main as work

    return work(list(flags))


@click.command("migrate", cls=Command)
def migrate() -> int:
    """Bring the database schema up to date.

    The database of GLUEJOBS_DATABASE_URL; it records which releases may work on it."""
    _need_server("migrate")
    from shared.core.config import get_settings
    from shared.core.db import Database
    from shared.core.migrate import upgrade
    from shared.core.release import RELEASE, ReleaseMismatch

    db = Database(get_settings().database_url)
    try:
        upgrade(db)
    except ReleaseMismatch as exc:
        print(f"gluejobs migrate: {exc}", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    print(f"database schema is up to date for gluejobs {RELEASE}")
    return 0


@click.command("demo", cls=Command)
@click.option(
    "--port",
    type=int,
    default=lambda: int(os.environ.get("GLUEJOBS_DEMO_PORT", "8000")),
    show_default="8000, or GLUEJOBS_DEMO_PORT",
    help="The demo API's port.",
)
@click.option("--stop", is_flag=True, help="Stop the API and worker a demo left running.")
def demo(port: int, stop: bool) -> int:
    """Fine-tune MiniLM on a small dataset, here, to watch.

    Starts an API and a worker on SQLite and submits the job; --stop stops them."""
    from gluejobs_server.demo import run_demo, stop_demo

    return stop_demo() if stop else run_demo(port=port)
