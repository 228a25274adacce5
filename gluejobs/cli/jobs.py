"""The job commands, at the top of `gluejobs` (the contract's `gluejobs submit`, `ls`, `show JOB` …):
submit, resubmit and rerun queue one; ls, show, logs, metrics, watch and download read them; cancel;
and workers, the fleet that runs them."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from gluejobs.cli import job_view
from gluejobs.cli.base import (
    Choice,
    ClientCommand,
    CliError,
    Invocation,
    job_options,
    json_or_text,
    key_values,
    note,
    script_flags,
)
from gluejobs.cli.files import upload_local_files
from gluejobs.cli.output import print_warnings, table, when
from gluejobs.cli.watch import watch_job
from gluejobs.client import ApiError, Client, Job
from shared.wire.vocabulary import JobStatus

STATUSES = tuple(status.value for status in JobStatus)  # `ls --status`'s choices, the API's words
JOB_ID = click.argument("job_id", type=int, metavar="JOB")
WATCH = click.option(
    "--watch", is_flag=True, help="Follow the job until it ends (exit 1 unless it succeeds)."
)


# Why ignore_unknown_options and an UNPROCESSED nargs=-1 argument: the scripts' flags are not
# click's. Every word submit does not know (a launcher, a script, its flags, in their order) is kept
# for gluejobs.cli.script_args, the one parser of those; submit's own options are taken wherever they are.
@click.command(
    "submit",
    cls=ClientCommand,
    json="the job (with --dry-run: the plan)",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("command_line", nargs=-1, type=click.UNPROCESSED, metavar="[COMMAND LINE]...")
@click.option(
    "--script",
    type=click.Path(path_type=Path),
    help="A shell script that runs one of the scripts (its exports honoured).",
)
@click.option(
    "--config",
    type=click.Path(path_type=Path),
    help="TrainingArguments and data/model arguments in a JSON or YAML file.",
)
@click.option(
    "--fast",
    is_flag=True,
    help="The fast path (spec field fast: true): length-grouped batches, bf16 with an fp32 head, sorted "
    "evaluation; values given beside it win. --dry-run shows what it sets.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the resolved spec and the API's checks of its local files; submit and upload nothing.",
)
@WATCH
@job_options
def submit(
    api: Invocation,
    command_line: tuple[str, ...],
    script: Path | None,
    config: Path | None,
    fast: bool,
    dry_run: bool,
    watch: bool,
    priority: int,
    max_attempts: int,
    metadata: tuple[str, ...],
) -> int:
    """Submit a job: a script's command line, a script or a config.

    Put `gluejobs submit` in front of the command line you would run (`python run_glue_no_trainer.py
    …`, `accelerate launch …`, `torchrun … run_glue.py …`, or the script's flags alone); every flag
    becomes a field of the job spec. A file on this machine that the spec names (--train_file
    ./mine.csv) is uploaded first, unless the API holds those bytes already."""
    # The flag translation reads the job spec's fields (pydantic): loaded only by this command.
    from gluejobs.cli.script_args import submission_spec

    with script_flags():
        spec = submission_spec(
            list(command_line), script=script, config=config, dry_run=dry_run, err=sys.stderr, fast=fast
        )
    if dry_run:
        return _print_plan(api, spec, priority=priority, max_attempts=max_attempts)
    pairs = key_values("--metadata", metadata)
    with api.client() as client:
        spec, _ = upload_local_files(client, spec, dry_run=False)
        return created(client, api, _create(client, spec, priority, max_attempts, pairs), watch=watch)


def _print_plan(api: Invocation, spec: dict[str, Any], *, priority: int, max_attempts: int) -> int:
    """The resolved spec and the API's dry run (data checks, steps, tokens, memory), when an API
    answers; nothing is stored. Files on this machine are checked by the API and not uploaded."""
    try:
        with api.client(retries=0) as client:
            spec, complete = upload_local_files(client, spec, dry_run=True)
            if not complete:
                note("note: no plan: the API has not got every local file yet (submit uploads them)")
                return 0
            plan = client.jobs.dry_run(spec, priority=priority, max_attempts=max_attempts)
    except ApiError as exc:
        if exc.code != "unreachable":
            raise
        api.show({"dry_run": True, "spec": spec}, json.dumps(spec, indent=2))
        note(f"note: no plan (data checks, steps, memory): {exc.message}")
        return 0
    api.show(plan.raw, [*job_view.plan_lines(plan.raw), "resolved spec:", json.dumps(plan.spec, indent=2)])
    return 0


@click.command("resubmit", cls=ClientCommand, json="the new job")
@JOB_ID
@click.option(
    "--set",
    "changes",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change a spec field (VALUE is read as JSON when it parses: 3, 2e-5, true, null, [..]); repeatable.",
)
@WATCH
@job_options
def resubmit(
    api: Invocation,
    job_id: int,
    changes: tuple[str, ...],
    watch: bool,
    priority: int,
    max_attempts: int,
    metadata: tuple[str, ...],
) -> int:
    """Submit a job's spec again, optionally changed.

    The new job's metadata says which job it came from (resubmitted_from)."""
    edits = {key: json_or_text(value) for key, value in key_values("--set", changes).items()}
    labels = key_values("--metadata", metadata)
    with api.client() as client:
        original = client.jobs.get(job_id)
        spec = {**original.spec, **edits}
        kept = {k: str(v) for k, v in original.metadata.items()}
        labels = {**kept, "resubmitted_from": str(original.id), **labels}
        return created(client, api, _create(client, spec, priority, max_attempts, labels), watch=watch)


@click.command("rerun", cls=ClientCommand, json="the new job")
@JOB_ID
@click.option("--watch", is_flag=True, help="Follow the rerun, then compare it with the original.")
def rerun(api: Invocation, job_id: int, watch: bool) -> int:
    """Queue a job's exact spec again, to see that it reproduces.

    Same spec, same seed. Once both have finished, `gluejobs show` says whether the metrics matched
    (with --watch: at once)."""
    with api.client() as client:
        job = client.jobs.rerun(job_id)
        code = created(client, api, job, watch=watch, what=f"queued (a rerun of job {job_id})")
        if watch:
            print("\n".join(job_view.reproduction_lines(client.jobs.get(job.id).reproduction)))
        elif not api.json:
            print(
                f"once both have finished, `gluejobs show {job.id}` says whether it reproduced job {job_id}"
            )
    return code


def _create(
    client: Client, spec: dict[str, Any], priority: int, max_attempts: int, metadata: dict[str, str]
) -> Job:
    return client.jobs.create(spec, priority=priority, max_attempts=max_attempts, metadata=metadata)


def created(client: Client, api: Invocation, job: Job, *, watch: bool, what: str = "queued") -> int:
    """A job a command created: its line (or its JSON) and its warnings; then, with `watch`, its run."""
    api.show(job.raw, f"job {job.id} {what} (seed {job.spec.get('seed')})")
    print_warnings(job.warnings)
    return watch_job(client, job.id) if watch else 0


@click.command("ls", cls=ClientCommand, json="the jobs (a list)")
@click.option("--status", multiple=True, type=Choice(STATUSES), help="Only jobs in this state (repeatable).")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many.")
def ls(api: Invocation, status: tuple[str, ...], limit: int) -> None:
    """List jobs, newest first.

    Columns: status (a queued job held back says by what), task, model, headline metric, progress,
    duration, created."""
    with api.client() as client:
        jobs = list(_take(client.jobs.list(status=list(status) or None), limit))
    rows = [job_view.ls_row(job) for job in jobs]
    api.show([job.raw for job in jobs], table(job_view.LS_COLUMNS, rows, right=job_view.LS_RIGHT))


def _take(items: Iterable[Job], limit: int) -> Iterable[Job]:
    for count, item in enumerate(items):
        if count >= limit:
            return
        yield item


@click.command("show", cls=ClientCommand, json="the job")
@JOB_ID
def show(api: Invocation, job_id: int) -> None:
    """A job: its status, metrics, checkpoints and spec.

    Status, progress, parameters, headline and latest metrics, best, checkpoints, warnings, what it
    waits for, a rerun's comparison, then its spec."""
    with api.client() as client:
        job = client.jobs.get(job_id)
        checkpoints = [] if api.json else client.jobs.checkpoints(job_id)
    api.show(job.raw, job_view.summary(job, checkpoints))


@click.command("cancel", cls=ClientCommand, json="the job")
@JOB_ID
def cancel(api: Invocation, job_id: int) -> None:
    """Cancel a queued or running job."""
    with api.client() as client:
        job = client.jobs.cancel(job_id)
    api.show(job.raw, f"job {job.id}: {job.status}")


@click.command("logs", cls=ClientCommand)
@JOB_ID
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@click.option("--attempt", type=int, help="This attempt's log (default: the newest).")
@click.option("--tail", type=int, help="Only the last N lines.")
def logs(api: Invocation, job_id: int, follow: bool, attempt: int | None, tail: int | None) -> None:
    """A job's log (a failed job's traceback)."""
    with api.client() as client:
        if not follow:
            sys.stdout.write(client.jobs.logs(job_id, attempt=attempt, tail=tail))
            return
        for text in client.jobs.follow_logs(job_id, attempt=attempt):
            sys.stdout.write(text)
            sys.stdout.flush()


METRIC_COLUMNS = ("id", "epoch", "step", "split", "name", "value", "created_at")


@click.command("metrics", cls=ClientCommand, json="the rows (a list; with --follow, once the job ends)")
@JOB_ID
@click.option("--follow", is_flag=True, help="Keep printing new rows until the job ends.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header line.")
@click.option("--split", help="Only this split: train, eval or eval_mismatched.")
@click.option("--name", help="Only this metric, e.g. loss, accuracy.")
def metrics(
    api: Invocation, job_id: int, follow: bool, as_csv: bool, split: str | None, name: str | None
) -> None:
    """A job's metric rows.

    One a line, or CSV (--csv), or one JSON list (--json)."""
    if api.json and as_csv:
        raise CliError("--json or --csv, not both")
    writer = csv.writer(sys.stdout, lineterminator="\n") if as_csv else None
    if writer:
        writer.writerow(METRIC_COLUMNS)
    with api.client() as client:
        rows = client.jobs.metrics(job_id, follow=follow, split=split, name=name)
        if api.json:  # one document: with --follow, once the job has ended
            api.show([row.raw for row in rows], ())
            return
        for row in rows:
            if writer:
                writer.writerow([row.raw[c] for c in METRIC_COLUMNS])
            else:
                where = f"step {row.step:>7}  epoch {row.epoch:>7.2f}  {row.split:<15}"
                print(f"{where} {row.name:<22} {row.value:.6g}")
            sys.stdout.flush()


@click.command("download", cls=ClientCommand)
@JOB_ID
@click.argument("dest", metavar="DIR")
@click.option("--checkpoint", type=int, metavar="STEP", help="The checkpoint saved at this step.")
@click.option(
    "--merged",
    is_flag=True,
    help="A LoRA job: its adapter (or --checkpoint's) merged into its base, a full model; queues the job "
    "that merges it when the LoRA job saved none, and waits for it.",
)
def download(api: Invocation, job_id: int, dest: str, checkpoint: int | None, merged: bool) -> None:
    """Download a job's final model, or one checkpoint, into DIR."""
    with api.client() as client:
        try:
            if merged:
                folder = client.jobs.download_merged(job_id, dest, checkpoint=checkpoint)
            else:
                folder = client.jobs.download(job_id, dest, checkpoint=checkpoint)
        except OSError as exc:  # the local side: a full disk, a folder that cannot be written
            raise CliError(f"cannot write the download into {dest}: {exc}") from exc
    what = f"checkpoint {checkpoint}" if checkpoint is not None else "model"
    what = f"merged {what}" if merged else what
    print(f"job {job_id}: {what} downloaded to {folder}")


@click.command("watch", cls=ClientCommand)
@JOB_ID
def watch(api: Invocation, job_id: int) -> int:
    """Follow a job: a progress bar, and a line per evaluation.

    The bar counts the job's optimizer steps, until the job ends (exit 1 unless it succeeds)."""
    with api.client() as client:
        return watch_job(client, job_id)


@click.command("workers", cls=ClientCommand, json="the workers (a list)")
def workers(api: Invocation) -> None:
    """List the workers.

    Columns: host, pid, state, devices, current jobs, last heartbeat, start."""
    with api.client() as client:
        fleet = client.workers.list()
    rows = [
        [
            worker.id,
            worker.host,
            str(worker.pid),
            worker.state,
            ",".join(worker.devices) or "-",
            ", ".join(f"{job['id']} (attempt {job['attempt']})" for job in worker.jobs) or "-",
            when(worker.last_heartbeat_at),
            when(worker.started_at),
        ]
        for worker in fleet
    ]
    columns = ("id", "host", "pid", "state", "devices", "jobs", "heartbeat", "started")
    api.show([worker.raw for worker in fleet], table(columns, rows, right={"pid"}))


COMMANDS = (submit, ls, workers, show, cancel, logs, metrics, download, resubmit, rerun, watch)
