"""The `gluejobs` command: serve, worker, submit, watch, demo, migrate.

The entry point sits above the layers it starts: it is the one module that reaches both sides,
and it imports each lazily (`gluejobs serve` never loads torch, and `gluejobs submit` loads
neither FastAPI nor torch). `serve` and `worker` hand their flags to service/ and worker/.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx

from gluejobs import research_cli
from gluejobs.script_args import ScriptArgsError, script_flags_to_spec

DEFAULT_URL = "http://127.0.0.1:8000"
POLL_INTERVAL_S = 2.0
TERMINAL = ("succeeded", "failed", "cancelled")
# Commands that hand the rest of the command line to another parser.
FORWARDING_COMMANDS = ("serve", "worker", "submit", "sweep")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command not in FORWARDING_COMMANDS and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # Servers log what they do; client commands print only their own lines.
    level = logging.INFO if args.command in ("serve", "worker", "migrate") else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    handlers: dict[str, Callable[[argparse.Namespace, list[str]], int | None]] = {
        "serve": _serve,
        "worker": _worker,
        "submit": _submit,
        "watch": _watch,
        "demo": _demo,
        "migrate": _migrate,
        "sweep": partial(research_cli.run_sweep, http=_http()),
        "glue-zip": partial(research_cli.run_glue_zip, http=_http()),
    }
    handler = handlers[args.command]
    try:
        return int(handler(args, extra) or 0)
    except (CliError, ScriptArgsError) as exc:
        print(f"gluejobs {args.command}: {exc}", file=sys.stderr)
        return 2


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""


def _http() -> research_cli.Http:
    return research_cli.Http(client=_client, check=_check, error=CliError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gluejobs", description="GLUE fine-tuning jobs as a REST service")
    commands = parser.add_subparsers(dest="command", required=True)

    # Their flags belong to service/ and worker/; `gluejobs serve --help` shows them.
    commands.add_parser("serve", help="run the HTTP API (migrates the database first)", add_help=False)
    commands.add_parser("worker", help="claim and run jobs (migrates the database first)", add_help=False)

    submit = commands.add_parser(
        "submit",
        help="submit a job: run_glue_no_trainer.py's own flags",
        allow_abbrev=False,
        description="Submit a job. Put `gluejobs submit` in place of `python run_glue_no_trainer.py`; "
        "every flag of the script (and the LoRA/Trainer options) becomes a field of the job spec.",
    )
    _client_options(submit)
    submit.add_argument("--priority", type=int, default=0)
    submit.add_argument("--max-attempts", type=int, default=3)
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--watch", action="store_true", help="follow the job until it ends")
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="print the API's plan (data checks, steps, memory); store nothing",
    )

    watch = commands.add_parser(
        "watch", help="print a job's status and metrics as they arrive, until it ends"
    )
    watch.add_argument("job_id", type=int)
    _client_options(watch)

    demo = commands.add_parser(
        "demo", help="start an API and a worker, and fine-tune MiniLM on a small dataset"
    )
    demo.add_argument("--port", type=int, default=int(os.environ.get("GLUEJOBS_DEMO_PORT", "8000")))
    demo.add_argument("--stop", action="store_true", help="stop the API and worker a demo left running")

    commands.add_parser("migrate", help="bring the database schema up to date")
    research_cli.add_commands(commands, _client_options)
    return parser


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=os.environ.get("GLUEJOBS_URL", DEFAULT_URL), help="the API's base URL"
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("GLUEJOBS_API_KEY"), help="a bearer key, if required"
    )


# ---------------------------------------------------------------------------------------------------
# serve, worker, migrate
# ---------------------------------------------------------------------------------------------------


def _migrate(_args: argparse.Namespace, _extra: list[str]) -> int:
    from shared.config import get_settings
    from shared.db import Database
    from shared.migrate import upgrade

    db = Database(get_settings().database_url)
    upgrade(db)
    db.dispose()
    print("database schema is up to date")
    return 0


def _serve(_args: argparse.Namespace, extra: list[str]) -> int:
    from service.server import main as serve

    return serve(extra)


def _worker(_args: argparse.Namespace, extra: list[str]) -> int:
    from worker.main import main as work

    return work(extra)


# ---------------------------------------------------------------------------------------------------
# submit and watch: an HTTP client of the API
# ---------------------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=30.0)


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.is_success:
        body: dict[str, Any] = response.json()
        return body
    try:
        error = response.json()["error"]
        where = f" ({error['field']})" if error.get("field") else ""
        raise CliError(f"{response.status_code} {error['code']}{where}: {error['message']}")
    except (ValueError, KeyError, TypeError):
        raise CliError(f"{response.status_code}: {response.text[:500]}") from None


def _submit(args: argparse.Namespace, extra: list[str]) -> int:
    notes: list[str] = []
    spec = script_flags_to_spec(extra, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    metadata = dict(item.split("=", 1) for item in args.metadata if "=" in item)
    body = {"spec": spec, "priority": args.priority, "max_attempts": args.max_attempts, "metadata": metadata}
    with _client(args) as client:
        if args.dry_run:
            try:
                plan = _check(client.post("/v1/jobs", params={"dry_run": "true"}, json=body))
            except httpx.HTTPError as exc:
                raise CliError(f"cannot reach the API at {args.url}: {exc}") from exc
            print("\n".join(research_cli.plan_lines(plan)))
            return 0
        try:
            job = _check(client.post("/v1/jobs", json=body))
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the API at {args.url}: {exc}") from exc
        print(f"job {job['id']} queued (seed {job['spec']['seed']})")
        if args.watch:
            return watch_job(client, job["id"])
    return 0


def _watch(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        try:
            return watch_job(client, args.job_id)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the API at {args.url}: {exc}") from exc


def watch_job(client: httpx.Client, job_id: int, *, out: Any = None) -> int:
    """Print status changes and metric rows as they arrive; 0 when the job succeeds, 1 otherwise."""
    out = out or sys.stdout
    cursor: str | None = None
    last_status = None
    while True:
        job = _check(client.get(f"/v1/jobs/{job_id}"))
        if job["status"] != last_status:
            last_status = job["status"]
            print(_status_line(job), file=out, flush=True)
        while True:  # every metric row written so far, page by page
            params: dict[str, str | int] = {"limit": 1000, **({"after": cursor} if cursor else {})}
            page = _check(client.get(f"/v1/jobs/{job_id}/metrics", params=params))
            for line in _metric_lines(page["data"]):
                print(line, file=out, flush=True)
            if page["data"]:
                cursor = str(page["data"][-1]["id"])
            if not page["has_more"]:
                break
        if job["status"] in TERMINAL:
            print(_final_line(job), file=out, flush=True)
            return 0 if job["status"] == "succeeded" else 1
        time.sleep(POLL_INTERVAL_S)


def _status_line(job: dict[str, Any]) -> str:
    line = f"job {job['id']}: {job['status']}"
    if job["status"] == "running":
        line += f" (attempt {job['attempts']} of {job['max_attempts']}, worker {job['worker_id']})"
    return line


def _metric_lines(rows: list[dict[str, Any]]) -> list[str]:
    grouped: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((row["step"], row["split"]), []).append(row)
    lines = []
    for (step, split), group in grouped.items():
        values = "  ".join(f"{r['name']} {r['value']:.4g}" for r in group)
        lines.append(f"  step {step:>6}  epoch {group[0]['epoch']:>6.2f}  {split:<15} {values}")
    return lines


def _final_line(job: dict[str, Any]) -> str:
    if job["status"] == "succeeded":
        result = job.get("result") or {}
        speed = result.get("train_samples_per_second")
        tail = f", {speed:.1f} train samples/s" if speed else ""
        return f"job {job['id']} succeeded{tail}; model in {job['output_dir']}"
    if job["status"] == "failed":
        return f"job {job['id']} failed: {job['error']}"
    return f"job {job['id']} {job['status']}"


def _demo(args: argparse.Namespace, _extra: list[str]) -> int:
    from gluejobs.demo import run_demo, stop_demo

    return stop_demo() if args.stop else run_demo(port=args.port)


if __name__ == "__main__":
    sys.exit(main())
