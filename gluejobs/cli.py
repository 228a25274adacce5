"""The `gluejobs` command.

Client commands (submit, ls, show, cancel, logs, metrics, download, resubmit, watch) talk to the API
through gluejobs.client and read GLUEJOBS_URL and GLUEJOBS_API_KEY. serve, worker, migrate and demo
start the service's parts: this entry point sits above the layers it starts and is the one module
that reaches both sides, each imported lazily (`gluejobs serve` never loads torch, and the client
commands load neither FastAPI nor torch). `serve` and `worker` hand their flags to service/ and worker/.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gluejobs import (
    files_cli,
    job_view,
    keys_cli,
    models_cli,
    owners_cli,
    research_cli,
    search_cli,
    webhooks_cli,
)
from gluejobs.arguments import CommandParser
from gluejobs.client import DEFAULT_URL, ApiError, Client, Job, RetryPolicy
from gluejobs.output import closed_pipe, print_error, print_json, table
from gluejobs.watch import watch_job

# Commands that hand the rest of the command line to another parser.
FORWARDING_COMMANDS = ("serve", "worker", "submit", "sweep", "search")
STATUSES = ("queued", "running", "cancelling", "succeeded", "failed", "cancelled")


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command not in FORWARDING_COMMANDS and extra:
        # Refused by the command's own parser, which knows its options (for "did you mean").
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    # Servers log what they do; client commands print only their own lines.
    level = logging.INFO if args.command in ("serve", "worker", "migrate") else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    handler: Callable[[argparse.Namespace, list[str]], int] = COMMANDS[args.command]
    try:
        return int(handler(args, extra) or 0)
    except (CliError, ApiError) as exc:
        print_error(args.command, exc)
        return 2
    except BrokenPipeError:  # `gluejobs ls | head`: the reader has what it wanted
        return closed_pipe()
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="gluejobs", description="GLUE fine-tuning jobs as a REST service")
    commands = parser.add_subparsers(dest="command", required=True)

    # Their flags belong to service/ and worker/; `gluejobs serve --help` shows them.
    commands.add_parser("serve", help="run the HTTP API (migrates the database first)", add_help=False)
    commands.add_parser("worker", help="claim and run jobs (migrates the database first)", add_help=False)
    commands.add_parser("migrate", help="bring the database schema up to date")
    demo = commands.add_parser(
        "demo", help="start an API and a worker, and fine-tune MiniLM on a small dataset"
    )
    demo.add_argument("--port", type=int, default=int(os.environ.get("GLUEJOBS_DEMO_PORT", "8000")))
    demo.add_argument("--stop", action="store_true", help="stop the API and worker a demo left running")

    submit = _client_command(
        commands,
        "submit",
        help="submit a job: a run_glue_no_trainer.py or run_glue.py command line, a script or a config",
        allow_abbrev=False,
        description="Submit a job. Put `gluejobs submit` in front of the command line you would run "
        "(`python run_glue_no_trainer.py …`, `accelerate launch …`, `torchrun … run_glue.py …`, or the "
        "script's flags alone); every flag becomes a field of the job spec.",
    )
    _job_options(submit)
    submit.add_argument(
        "--script", type=Path, help="a shell script that runs one of the scripts (its exports honoured)"
    )
    submit.add_argument(
        "--config", type=Path, help="TrainingArguments and data/model arguments in a JSON or YAML file"
    )
    submit.add_argument(
        "--fast",
        action="store_true",
        help="the fast path (spec field fast: true): length-grouped batches, bf16 with an fp32 head, sorted "
        "evaluation; values given beside it win. --dry-run shows what it sets",
    )
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved spec and the API's checks of its local files; submit and upload nothing",
    )
    submit.add_argument("--watch", action="store_true", help="follow the job until it ends")
    _json_option(submit, "the job (with --dry-run: the plan) as the API returns it")

    ls = _client_command(commands, "ls", help="list jobs, newest first")
    ls.add_argument("--status", action="append", choices=STATUSES, help="only these (repeatable)")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    _json_option(ls, "the jobs as one JSON list")

    workers = _client_command(commands, "workers", help="list workers: host, devices, state, current jobs")
    _json_option(workers, "the workers as one JSON list")

    show = _client_command(commands, "show", help="a job: status, metrics, checkpoints, warnings, spec")
    show.add_argument("job_id", type=int)
    _json_option(show, "the job as the API returns it")

    cancel = _client_command(commands, "cancel", help="cancel a queued or running job")
    cancel.add_argument("job_id", type=int)
    _json_option(cancel, "the job as the API returns it")

    logs = _client_command(commands, "logs", help="a job's log (a failed job's traceback)")
    logs.add_argument("job_id", type=int)
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--attempt", type=int, help="this attempt's log (default: the newest)")
    logs.add_argument("--tail", type=int, help="only the last N lines")

    metrics = _client_command(commands, "metrics", help="a job's metric rows")
    metrics.add_argument("job_id", type=int)
    metrics.add_argument("--follow", action="store_true", help="keep printing new rows until the job ends")
    metrics.add_argument("--csv", action="store_true", help="CSV with a header line")
    metrics.add_argument("--split", help="train, eval or eval_mismatched")
    metrics.add_argument("--name", help="e.g. loss, accuracy")
    _json_option(metrics, "the rows as one JSON list (with --follow: once the job ends)")

    download = _client_command(commands, "download", help="download a job's final model or a checkpoint")
    download.add_argument("job_id", type=int)
    download.add_argument("dest", metavar="DIR")
    download.add_argument("--checkpoint", type=int, metavar="STEP", help="the checkpoint saved at this step")

    resubmit = _client_command(commands, "resubmit", help="submit a job's spec again, optionally changed")
    resubmit.add_argument("job_id", type=int)
    resubmit.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="changes",
        help="change a spec field (VALUE is read as JSON when it parses: 3, 2e-5, true, null, [..])",
    )
    _job_options(resubmit)
    resubmit.add_argument("--watch", action="store_true", help="follow the new job until it ends")
    _json_option(resubmit, "the new job as the API returns it")

    watch = _client_command(
        commands, "watch", help="a progress bar over the job's optimizer steps, and a line per evaluation"
    )
    watch.add_argument("job_id", type=int)

    research_cli.add_commands(commands, _client_command)
    search_cli.add_command(commands, _client_command)
    files_cli.add_commands(commands, _client_command)
    models_cli.add_commands(commands, _client_command)
    keys_cli.add_commands(commands, _client_command)
    owners_cli.add_commands(commands, _client_command)
    webhooks_cli.add_commands(commands, _client_command)
    return parser


def _client_command(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, **kwargs)
    parser.set_defaults(command_parser=parser)
    parser.add_argument(
        "--url", default=os.environ.get("GLUEJOBS_URL", DEFAULT_URL), help="the API's base URL"
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("GLUEJOBS_API_KEY"), help="a bearer key, if required"
    )
    return parser


def _json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"{what}: one JSON document")


def _job_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--priority", type=int, default=0)
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")


# A person at a terminal would rather hear at once that nobody is listening, but an API that answers
# 503 (its database away) or 429 is waited for, as long as it asks (Retry-After), with backoff.
CLI_RETRIES = RetryPolicy(connect_retries=2)


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, api_key=args.api_key or "", retries=CLI_RETRIES)


# ---------------------------------------------------------------------------------------------------
# serve, worker, migrate, demo: the service's own parts, imported only when asked for
# ---------------------------------------------------------------------------------------------------


# What each of the service's commands needs beyond this client (the gluejobs-server distribution),
# and the line that installs it: the client alone (`pip install gluejobs`) holds none of it.
SERVER_PARTS = {
    "serve": (("service", "shared", "fastapi"), "pip install gluejobs-server"),
    "migrate": (("shared", "alembic", "sqlalchemy"), "pip install gluejobs-server"),
    "worker": (
        ("worker", "shared", "torch", "transformers"),
        'pip install "gluejobs-server[worker]" (README, "Install": the CPU or the CUDA build of torch)',
    ),
}


def _need_server(command: str) -> None:
    """One line saying what to install when this machine lacks what `command` runs."""
    import importlib.util

    modules, line = SERVER_PARTS[command]
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise CliError(f"this machine has the gluejobs client only ({', '.join(missing)} missing): {line}")


def _serve(_args: argparse.Namespace, extra: list[str]) -> int:
    _need_server("serve")
    from service.server import main as serve

    return serve(extra)


def _worker(_args: argparse.Namespace, extra: list[str]) -> int:
    _need_server("worker")
    from worker.main import main as work

    return work(extra)


def _migrate(_args: argparse.Namespace, _extra: list[str]) -> int:
    _need_server("migrate")
    from shared.config import get_settings
    from shared.db import Database
    from shared.migrate import upgrade
    from shared.release import RELEASE, ReleaseMismatch

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


def _demo(args: argparse.Namespace, _extra: list[str]) -> int:
    from gluejobs.demo import run_demo, stop_demo

    return stop_demo() if args.stop else run_demo(port=args.port)


# ---------------------------------------------------------------------------------------------------
# Client commands
# ---------------------------------------------------------------------------------------------------


def _submit(args: argparse.Namespace, extra: list[str]) -> int:
    # The flag translation reads the job spec's fields (pydantic): loaded only by this command.
    from gluejobs.script_args import ScriptArgsError, submission_spec

    try:
        spec = submission_spec(
            extra,
            script=args.script,
            config=args.config,
            dry_run=args.dry_run,
            err=sys.stderr,
            fast=args.fast,
        )
    except ScriptArgsError as exc:
        raise CliError(str(exc)) from exc
    if args.dry_run:
        return _print_plan(args, spec)
    with _client(args) as client:  # files on this machine are uploaded first (hash first)
        spec, _ = files_cli.upload_local_files(client, spec, dry_run=False)
    return _create(args, spec, _metadata(args.metadata))


def _print_plan(args: argparse.Namespace, spec: dict[str, Any]) -> int:
    """The resolved spec and the API's dry run (data checks, steps, tokens, memory), when an API
    answers; nothing is stored. Files on this machine are checked by the API and not uploaded."""
    try:
        with Client(args.url, api_key=args.api_key or "", retries=0) as client:
            spec, complete = files_cli.upload_local_files(client, spec, dry_run=True)
            if not complete:
                print(
                    "note: no plan: the API has not got every local file yet (submit uploads them)",
                    file=sys.stderr,
                )
                return 0
            plan = client.jobs.dry_run(spec, priority=args.priority, max_attempts=args.max_attempts)
    except ApiError as exc:
        if exc.code != "unreachable":
            raise
        if args.json:
            print_json({"dry_run": True, "spec": spec})
        else:
            print(json.dumps(spec, indent=2))
        print(f"note: no plan (data checks, steps, memory): {exc.message}", file=sys.stderr)
        return 0
    if args.json:
        print_json(plan.raw)
        return 0
    # The plan (its warnings first) before the resolved spec's many lines.
    print("\n".join(research_cli.plan_lines(plan.raw)))
    print("resolved spec:")
    print(json.dumps(plan.spec, indent=2))
    return 0


def _sweep(args: argparse.Namespace, extra: list[str]) -> int:
    from gluejobs.script_args import ScriptArgsError

    try:
        with _client(args) as client:
            return research_cli.run_sweep(args, extra, client)
    except ScriptArgsError as exc:
        raise CliError(str(exc)) from exc


def _search(args: argparse.Namespace, extra: list[str]) -> int:
    from gluejobs.script_args import ScriptArgsError

    try:
        with _client(args) as client:
            return search_cli.run_search(args, extra, client)
    except ScriptArgsError as exc:
        raise CliError(str(exc)) from exc


def _files(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        return files_cli.run_files(args, client)


def _models(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        return models_cli.run_models(args, client)


def _keys(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        return keys_cli.run_keys(args, client)


def _audit(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        return keys_cli.run_audit(args, client)


def _owners(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        return owners_cli.run_owners(args, client)


def _webhooks(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        return webhooks_cli.run_webhooks(args, client)


def _glue_zip(args: argparse.Namespace, extra: list[str]) -> int:
    with _client(args) as client:
        return research_cli.run_glue_zip(args, extra, client)


def _leaderboard(args: argparse.Namespace, extra: list[str]) -> int:
    with _client(args) as client:
        return research_cli.run_leaderboard(args, extra, client)


def _rerun(args: argparse.Namespace, extra: list[str]) -> int:
    with _client(args) as client:
        return research_cli.run_rerun(args, extra, client)


def _resubmit(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        original = client.jobs.get(args.job_id)
    spec = dict(original.spec)
    for change in args.changes:
        key, value = _assignment(change)
        spec[key] = value
    metadata = {**{k: str(v) for k, v in original.metadata.items()}, "resubmitted_from": str(original.id)}
    return _create(args, spec, {**metadata, **_metadata(args.metadata)})


def _create(args: argparse.Namespace, spec: dict[str, Any], metadata: dict[str, str]) -> int:
    with _client(args) as client:
        job = client.jobs.create(
            spec, priority=args.priority, max_attempts=args.max_attempts, metadata=metadata
        )
        return job_view.created(client, job, json_output=args.json, watch=args.watch)


def _ls(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        jobs = list(_take(client.jobs.list(status=args.status), args.limit))
    if args.json:
        print_json([job.raw for job in jobs])
        return 0
    rows = [job_view.ls_row(job) for job in jobs]
    print("\n".join(table(job_view.LS_COLUMNS, rows, right=job_view.LS_RIGHT)))
    return 0


def _workers(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        workers = client.workers.list()
    if args.json:
        print_json([worker.raw for worker in workers])
        return 0
    rows = [
        [
            worker.id,
            worker.host,
            str(worker.pid),
            worker.state,
            ",".join(worker.devices) or "-",
            ", ".join(f"{job['id']} (attempt {job['attempt']})" for job in worker.jobs) or "-",
            job_view.when(worker.last_heartbeat_at),
            job_view.when(worker.started_at),
        ]
        for worker in workers
    ]
    columns = ("id", "host", "pid", "state", "devices", "jobs", "heartbeat", "started")
    print("\n".join(table(columns, rows, right={"pid"})))
    return 0


def _show(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        job = client.jobs.get(args.job_id)
        checkpoints = client.jobs.checkpoints(args.job_id)
    if args.json:
        print_json(job.raw)
        return 0
    print("\n".join(job_view.summary(job, checkpoints)))
    return 0


def _cancel(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        job = client.jobs.cancel(args.job_id)
    if args.json:
        print_json(job.raw)
    else:
        print(f"job {job.id}: {job.status}")
    return 0


def _logs(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        if not args.follow:
            sys.stdout.write(client.jobs.logs(args.job_id, attempt=args.attempt, tail=args.tail))
            return 0
        for text in client.jobs.follow_logs(args.job_id, attempt=args.attempt):
            sys.stdout.write(text)
            sys.stdout.flush()
    return 0


def _metrics(args: argparse.Namespace, _extra: list[str]) -> int:
    columns = ("id", "epoch", "step", "split", "name", "value", "created_at")
    if args.json and args.csv:
        raise CliError("--json or --csv, not both")
    writer = csv.writer(sys.stdout, lineterminator="\n") if args.csv else None
    if writer:
        writer.writerow(columns)
    with _client(args) as client:
        rows = client.jobs.metrics(args.job_id, follow=args.follow, split=args.split, name=args.name)
        if args.json:
            print_json([row.raw for row in rows])
            return 0
        for row in rows:
            if writer:
                writer.writerow([row.raw[c] for c in columns])
            else:
                where = f"step {row.step:>7}  epoch {row.epoch:>7.2f}  {row.split:<15}"
                print(f"{where} {row.name:<22} {row.value:.6g}")
            sys.stdout.flush()
    return 0


def _download(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        try:
            dest = client.jobs.download(args.job_id, args.dest, checkpoint=args.checkpoint)
        except OSError as exc:  # the local side: a full disk, a folder that cannot be written
            raise CliError(f"cannot write the download into {args.dest}: {exc}") from exc
    what = f"checkpoint {args.checkpoint}" if args.checkpoint is not None else "model"
    print(f"job {args.job_id}: {what} downloaded to {dest}")
    return 0


def _watch(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        return watch_job(client, args.job_id)


# ---------------------------------------------------------------------------------------------------
# Parsing options
# ---------------------------------------------------------------------------------------------------


def _metadata(items: list[str]) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in items]
    bad = [item for item, pair in zip(items, pairs, strict=True) if len(pair) != 2 or not pair[0]]
    if bad:
        raise CliError(f"--metadata takes KEY=VALUE, not {bad[0]!r}")
    return dict((key, value) for key, value in pairs)


def _assignment(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise CliError(f"--set takes KEY=VALUE, not {item!r}")
    try:
        return key, json.loads(text)
    except ValueError:
        return key, text


def _take(items: Iterable[Job], limit: int) -> Iterable[Job]:
    for count, item in enumerate(items):
        if count >= limit:
            return
        yield item


COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "serve": _serve,
    "worker": _worker,
    "migrate": _migrate,
    "demo": _demo,
    "submit": _submit,
    "ls": _ls,
    "workers": _workers,
    "show": _show,
    "cancel": _cancel,
    "logs": _logs,
    "metrics": _metrics,
    "download": _download,
    "resubmit": _resubmit,
    "watch": _watch,
    "sweep": _sweep,
    "search": _search,
    "glue-zip": _glue_zip,
    "leaderboard": _leaderboard,
    "rerun": _rerun,
    "files": _files,
    "models": _models,
    "keys": _keys,
    "audit": _audit,
    "owners": _owners,
    "webhooks": _webhooks,
}


if __name__ == "__main__":
    sys.exit(main())
