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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gluejobs import files_cli, research_cli
from gluejobs.client import DEFAULT_URL, ApiError, Client, Job, RetryPolicy
from gluejobs.watch import watch_job

# Commands that hand the rest of the command line to another parser.
FORWARDING_COMMANDS = ("serve", "worker", "submit", "sweep")
STATUSES = ("queued", "running", "cancelling", "succeeded", "failed", "cancelled")


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command not in FORWARDING_COMMANDS and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # Servers log what they do; client commands print only their own lines.
    level = logging.INFO if args.command in ("serve", "worker", "migrate") else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    handler: Callable[[argparse.Namespace, list[str]], int] = COMMANDS[args.command]
    try:
        return int(handler(args, extra) or 0)
    except (CliError, ApiError) as exc:
        print(f"gluejobs {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gluejobs", description="GLUE fine-tuning jobs as a REST service")
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

    ls = _client_command(commands, "ls", help="list jobs, newest first")
    ls.add_argument("--status", action="append", choices=STATUSES, help="only these (repeatable)")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    ls.add_argument("--json", action="store_true", help="one JSON object a line")

    workers = _client_command(commands, "workers", help="list workers: host, devices, state, current jobs")
    workers.add_argument("--json", action="store_true", help="one JSON object a line")

    show = _client_command(commands, "show", help="a job: status, spec, metrics, checkpoints")
    show.add_argument("job_id", type=int)
    show.add_argument("--json", action="store_true", help="the job as the API returns it")

    cancel = _client_command(commands, "cancel", help="cancel a queued or running job")
    cancel.add_argument("job_id", type=int)

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

    watch = _client_command(
        commands, "watch", help="a progress bar over the job's optimizer steps, and a line per evaluation"
    )
    watch.add_argument("job_id", type=int)

    research_cli.add_commands(commands, _client_command)
    files_cli.add_commands(commands, _client_command)
    return parser


def _client_command(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, **kwargs)
    parser.add_argument(
        "--url", default=os.environ.get("GLUEJOBS_URL", DEFAULT_URL), help="the API's base URL"
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("GLUEJOBS_API_KEY"), help="a bearer key, if required"
    )
    return parser


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


def _serve(_args: argparse.Namespace, extra: list[str]) -> int:
    from service.server import main as serve

    return serve(extra)


def _worker(_args: argparse.Namespace, extra: list[str]) -> int:
    from worker.main import main as work

    return work(extra)


def _migrate(_args: argparse.Namespace, _extra: list[str]) -> int:
    from shared.config import get_settings
    from shared.db import Database
    from shared.migrate import upgrade

    db = Database(get_settings().database_url)
    upgrade(db)
    db.dispose()
    print("database schema is up to date")
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
        print(json.dumps(spec, indent=2))
        return _print_plan(args, spec)
    with _client(args) as client:  # files on this machine are uploaded first (hash first)
        spec, _ = files_cli.upload_local_files(client, spec, dry_run=False)
    return _create(args, spec, _metadata(args.metadata))


def _print_plan(args: argparse.Namespace, spec: dict[str, Any]) -> int:
    """The API's dry run (data checks, steps, tokens, memory), when an API answers; nothing is stored."""
    try:
        with Client(args.url, api_key=args.api_key or "", retries=0) as client:
            spec, complete = files_cli.upload_local_files(client, spec, dry_run=True)
            if not complete:
                print("note: no plan: the API has not got every local file yet (submit uploads them)")
                return 0
            body = {"spec": spec, "priority": args.priority, "max_attempts": args.max_attempts}
            plan = client.request("POST", "/v1/jobs", params={"dry_run": "true"}, json=body)
    except ApiError as exc:
        if exc.code != "unreachable":
            raise
        print(f"note: no plan (data checks, steps, memory): {exc}", file=sys.stderr)
        return 0
    print("\n".join(research_cli.plan_lines(plan)))
    return 0


def _sweep(args: argparse.Namespace, extra: list[str]) -> int:
    from gluejobs.script_args import ScriptArgsError

    try:
        with _client(args) as client:
            return research_cli.run_sweep(args, extra, client)
    except ScriptArgsError as exc:
        raise CliError(str(exc)) from exc


def _files(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        return files_cli.run_files(args, client)


def _glue_zip(args: argparse.Namespace, extra: list[str]) -> int:
    with _client(args) as client:
        return research_cli.run_glue_zip(args, extra, client)


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
        print(f"job {job.id} queued (seed {job.spec.get('seed')})")
        if args.watch:
            return watch_job(client, job.id)
    return 0


def _ls(args: argparse.Namespace, _extra: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    with _client(args) as client:
        jobs = list(_take(client.jobs.list(status=args.status), args.limit))
    if args.json:
        for job in jobs:
            print(json.dumps(job.raw))
        return 0
    table = Table(box=None, pad_edge=False)
    for column in ("id", "status", "task", "model", "metric", "progress", "duration", "created"):
        table.add_column(column, justify="right" if column in ("id", "metric") else "left")
    for job in jobs:
        table.add_row(
            str(job.id),
            job.status,
            _task(job),
            str(job.spec.get("model_name_or_path", "")),
            _headline(job),
            _progress(job),
            _duration(job),
            _when(job.created_at),
        )
    Console(width=200 if not sys.stdout.isatty() else None).print(table)
    return 0


def _workers(args: argparse.Namespace, _extra: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    with _client(args) as client:
        workers = client.workers.list()
    if args.json:
        for worker in workers:
            print(json.dumps(worker.raw))
        return 0
    table = Table(box=None, pad_edge=False)
    for column in ("id", "host", "pid", "state", "devices", "jobs", "heartbeat", "started"):
        table.add_column(column, justify="right" if column == "pid" else "left")
    for worker in workers:
        jobs = ", ".join(f"{job['id']} (attempt {job['attempt']})" for job in worker.jobs) or "-"
        table.add_row(
            worker.id,
            worker.host,
            str(worker.pid),
            worker.state,
            ",".join(worker.devices) or "-",
            jobs,
            _when(worker.last_heartbeat_at),
            _when(worker.started_at),
        )
    Console(width=200 if not sys.stdout.isatty() else None).print(table)
    return 0


def _show(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        job = client.jobs.get(args.job_id)
        checkpoints = client.jobs.checkpoints(args.job_id)
    if args.json:
        print(json.dumps(job.raw, indent=2))
        return 0
    lines = [
        f"job {job.id}: {job.status} (attempt {job.attempts} of {job.max_attempts})",
        f"  task      {_task(job)}    model {job.spec.get('model_name_or_path')}",
        f"  created   {_when(job.created_at)}    duration {_duration(job)}",
        f"  progress  {_progress(job)}    {_headline(job)}",
    ]
    if job.worker_id:
        lines.append(f"  worker    {job.worker_id} (attempt {job.attempts})")
    if job.error:
        lines.append(f"  error     {job.error_code or 'failed'}: {job.error.splitlines()[0]}")
    for split, values in sorted(job.latest_metrics.items()):
        shown = ", ".join(f"{k} {v:.4g}" for k, v in values.items() if k not in ("step", "epoch"))
        lines.append(f"  {split:<9} {shown} (step {values.get('step')})")
    if job.best_metrics:
        best = job.best_metrics
        lines.append(f"  best      {best['metric']} {best['value']:.4f} at step {best['step']}")
    for checkpoint in checkpoints:
        mark = " (best)" if checkpoint.is_best else ""
        lines.append(
            f"  checkpoint step {checkpoint.step} epoch {checkpoint.epoch:g}{mark}: {checkpoint.path}"
        )
    lines.append("  spec      " + json.dumps(job.spec, sort_keys=True))
    print("\n".join(lines))
    return 0


def _cancel(args: argparse.Namespace, _extra: list[str]) -> int:
    with _client(args) as client:
        job = client.jobs.cancel(args.job_id)
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
    writer = csv.writer(sys.stdout, lineterminator="\n") if args.csv else None
    if writer:
        writer.writerow(columns)
    with _client(args) as client:
        for row in client.jobs.metrics(args.job_id, follow=args.follow, split=args.split, name=args.name):
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
# Formatting
# ---------------------------------------------------------------------------------------------------


def _task(job: Job) -> str:
    return str(job.spec.get("task_name") or job.spec.get("train_file") or "")


def _headline(job: Job) -> str:
    headline = job.headline_metric or {}
    value = headline.get("best") if headline.get("best") is not None else headline.get("value")
    return f"{headline['name']} {value:.4f}" if value is not None else ""


def _progress(job: Job) -> str:
    train = job.latest_metrics.get("train") or {}
    step = train.get("step")
    if step is None:
        return ""
    total = (job.result or {}).get("completed_steps") or job.spec.get("max_train_steps")
    return f"step {step}{f'/{total}' if total else ''} · epoch {train.get('epoch', 0):.2f}"


def _duration(job: Job) -> str:
    if job.started_at is None:
        return ""
    seconds = int(((job.finished_at or datetime.now(UTC)) - job.started_at).total_seconds())
    return (
        f"{seconds // 3600}h{seconds // 60 % 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment else ""


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
    "glue-zip": _glue_zip,
    "files": _files,
}


if __name__ == "__main__":
    sys.exit(main())
