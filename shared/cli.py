"""The `gluejobs` command: serve, worker, submit, watch, demo, migrate.

This is the one module that reaches into both sides, and it imports each lazily: `gluejobs serve`
never loads torch, and `gluejobs submit` loads neither FastAPI nor torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any, get_args, get_origin

import httpx

from shared.spec import JobSpec

if TYPE_CHECKING:
    from shared.config import Settings
    from shared.db import Database

DEFAULT_URL = "http://127.0.0.1:8000"
POLL_INTERVAL_S = 2.0
TERMINAL = ("succeeded", "failed", "cancelled")

# Flags of run_glue_no_trainer.py that have no place in a service, and why.
UNSUPPORTED_SCRIPT_FLAGS = {
    "output_dir": "the service chooses each job's output folder (GLUEJOBS_ARTIFACTS_DIR/jobs/<id>); ignored",
    "push_to_hub": None,
    "hub_model_id": None,
    "hub_token": None,
    "resume_from_checkpoint": None,
}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command != "submit" and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # Servers log what they do; client commands print only their own lines.
    level = logging.INFO if args.command in ("serve", "worker", "migrate") else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    handler = {
        "serve": _serve,
        "worker": _worker,
        "submit": _submit,
        "watch": _watch,
        "demo": _demo,
        "migrate": _migrate,
    }[args.command]
    try:
        return int(handler(args, extra) or 0)
    except CliError as exc:
        print(f"gluejobs {args.command}: {exc}", file=sys.stderr)
        return 2


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gluejobs", description="GLUE fine-tuning jobs as a REST service")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP API (migrates the database first)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)

    worker = commands.add_parser("worker", help="claim and run jobs (migrates the database first)")
    worker.add_argument("--exit-when-idle", action="store_true", help="drain the queue, then exit")
    worker.add_argument("--max-jobs", type=int, default=None, help="exit after this many jobs")

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


def _migrated_database() -> tuple[Settings, Database]:
    """The settings and the database, its schema brought up to date (every server command starts so)."""
    from shared.config import get_settings
    from shared.db import Database
    from shared.migrate import upgrade

    settings = get_settings()
    db = Database(settings.database_url)
    upgrade(db)
    return settings, db


def _migrate(_args: argparse.Namespace, _extra: list[str]) -> int:
    _, db = _migrated_database()
    db.dispose()
    print("database schema is up to date")
    return 0


def _serve(args: argparse.Namespace, _extra: list[str]) -> int:
    import uvicorn

    from service.main import create_app

    settings, db = _migrated_database()
    uvicorn.run(create_app(settings, db), host=args.host, port=args.port, log_level="info")
    return 0


def _worker(args: argparse.Namespace, _extra: list[str]) -> int:
    from worker.runner import Worker

    settings, db = _migrated_database()
    worker = Worker(settings, db)
    worker.install_signal_handlers()
    worker.run(exit_when_idle=args.exit_when_idle, max_jobs=args.max_jobs)
    return 0


# ---------------------------------------------------------------------------------------------------
# submit and watch: an HTTP client of the API
# ---------------------------------------------------------------------------------------------------


def script_flags_to_spec(flags: list[str]) -> dict[str, Any]:
    """Translate run_glue_no_trainer.py's command line into a spec dict (values stay strings where the
    API converts them, so its error names the field)."""
    parser = argparse.ArgumentParser(prog="gluejobs submit", add_help=False)
    for name, info in JobSpec.model_fields.items():
        names = [name]
        alias = info.validation_alias
        if alias is not None and hasattr(alias, "choices"):
            names += [c for c in alias.choices if isinstance(c, str) and c != name]
        flags_for = [f"--{n}" for n in names]
        if _is_bool(info.annotation):
            parser.add_argument(*flags_for, dest=name, nargs="?", const="true", default=None)
        elif _is_list(info.annotation):
            parser.add_argument(*flags_for, dest=name, nargs="+", default=None)
        else:
            parser.add_argument(*flags_for, dest=name, default=None)
    parser.add_argument("--checkpointing_steps", default=None)
    for name in UNSUPPORTED_SCRIPT_FLAGS:
        parser.add_argument(f"--{name}", nargs="?", const="true", default=None)
    values, unknown = parser.parse_known_args(flags)
    if unknown:
        raise CliError(
            f"unknown flag(s): {' '.join(unknown)} (see `gluejobs submit --help` and the job spec)"
        )
    spec: dict[str, Any] = {}
    for name, value in vars(values).items():
        if value is None:
            continue
        if name in UNSUPPORTED_SCRIPT_FLAGS:
            reason = UNSUPPORTED_SCRIPT_FLAGS[name]
            if reason is None:
                raise CliError(f"--{name} is not supported by the service")
            print(f"note: --{name}: {reason}", file=sys.stderr)
            continue
        spec[name] = value
    return spec


def _is_bool(annotation: Any) -> bool:
    """bool or bool | None: flags that may stand alone (`--fp16`) or take a value (`--fp16 false`)."""
    if annotation is bool:
        return True
    return (
        get_origin(annotation) is not None
        and bool in get_args(annotation)
        and get_origin(annotation) is not list
    )


def _is_list(annotation: Any) -> bool:
    return get_origin(annotation) is list or any(get_origin(a) is list for a in get_args(annotation))


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
    spec = script_flags_to_spec(extra)
    metadata = dict(item.split("=", 1) for item in args.metadata if "=" in item)
    body = {"spec": spec, "priority": args.priority, "max_attempts": args.max_attempts, "metadata": metadata}
    with _client(args) as client:
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
    from shared.demo import run_demo, stop_demo

    return stop_demo() if args.stop else run_demo(port=args.port)


if __name__ == "__main__":
    sys.exit(main())
