"""`gluejobs files ls|upload|rm`, and what `gluejobs submit` does with files on this machine.

`gluejobs submit … --train_file ./mine.csv`: a spec file that names a file on this machine is
uploaded first — hashed, and sent only when the API does not hold those bytes already — and the job
is submitted with its id. With `--dry-run` nothing is kept: each local file is checked by the API
(`POST /v1/files?dry_run=true`) and the checks are printed; the job's plan follows when the API
already holds every such file.
"""

from __future__ import annotations

import json
from typing import Any

import click

from gluejobs._files import COLUMN_FIELDS, PURPOSE_OF_FIELD, LocalFile, is_local_file
from gluejobs.cli.base import Choice, ClientCommand, Group, Invocation, note
from gluejobs.cli.output import print_warnings
from gluejobs.client import Client, FileInfo


@click.group("files", cls=Group)
def files() -> None:
    """Uploaded data files: ls, upload, rm.

    A job names one by its id (or `gluejobs submit --train_file ./mine.csv` uploads it first)."""


@files.command("ls", cls=ClientCommand, json="the files (a list)")
def ls(api: Invocation) -> None:
    """Your uploaded files, newest first.

    Each: id, name, size, rows, digest, labels."""
    with api.client() as client:
        found = list(client.files.list())
    api.show([file.raw for file in found], [_line(file) for file in found] or "no files")


@files.command("upload", cls=ClientCommand, json="the file")
@click.argument("path")
@click.option(
    "--purpose",
    type=Choice(tuple(PURPOSE_OF_FIELD.values())),
    default="train",
    show_default=True,
    help="Which split the file holds (its checks depend on it).",
)
@click.option("--task-name", help="Check its labels against this GLUE task.")
@click.option(
    "--text_column", "--text-column", "text_column", metavar="COLUMN", help="The column that holds the text."
)
@click.option(
    "--text_pair_column",
    "--text-pair-column",
    "text_pair_column",
    metavar="COLUMN",
    help="The column that holds a sentence pair's second text.",
)
@click.option(
    "--label_column",
    "--label-column",
    "--target_column",  # AutoTrain's name
    "--target-column",
    "label_column",
    metavar="COLUMN",
    help="The column that holds the labels (default: label).",
)
def upload(
    api: Invocation,
    path: str,
    purpose: str,
    task_name: str | None,
    text_column: str | None,
    text_pair_column: str | None,
    label_column: str | None,
) -> None:
    """Upload a data file (not sent again if the API has it).

    CSV, JSON lines or TSV; it is hashed first, and not sent when the API holds those bytes already."""
    named = {"text_column": text_column, "text_pair_column": text_pair_column, "label_column": label_column}
    columns = {name: value for name in COLUMN_FIELDS if (value := named[name]) is not None}
    with api.client() as client:
        file = client.files.create(path, purpose=purpose, task_name=task_name, columns=columns)
    api.show(file.raw, _line(file))
    print_warnings(warning.line() for warning in file.warning_problems)


@files.command("rm", cls=ClientCommand)
@click.argument("file_id", metavar="FILE")
def remove(api: Invocation, file_id: str) -> None:
    """Delete an uploaded file.

    Refused while a queued or running job uses it."""
    with api.client() as client:
        client.files.delete(file_id)
    print(f"{file_id} deleted")


def _line(file: FileInfo) -> str:
    labels = file.checks.get("label_counts") or file.checks.get("score_range") or {}
    shown = ", ".join(f"{k} {v}" for k, v in labels.items())
    return f"{file.id}  {file.filename}  {file.bytes} bytes  {file.rows} rows  sha256 {file.sha256[:12]}…" + (
        f"  labels: {shown}" if shown else ""
    )


def upload_local_files(client: Client, spec: dict[str, Any], *, dry_run: bool) -> tuple[dict[str, Any], bool]:
    """The spec with each file on this machine replaced by the id of its upload, and whether every
    one could be (with `dry_run`, only files the API already holds are; the others are checked and
    their checks printed, and nothing is kept)."""
    resolved = dict(spec)
    complete = True
    for field, purpose in PURPOSE_OF_FIELD.items():
        value = spec.get(field)
        if not isinstance(value, str) or not is_local_file(value):
            continue
        task_name = spec.get("task_name")
        named = {**spec, "label_column": spec.get("label_column", spec.get("target_column"))}  # its alias
        columns = {name: named[name] for name in COLUMN_FIELDS if isinstance(named.get(name), str)}
        if not dry_run:
            file = client.files.create(value, purpose=purpose, task_name=task_name, columns=columns)
            note(f"{field} {value}: {file.id} ({file.bytes} bytes, sha256 {file.sha256[:12]}…)")
            print_warnings(warning.line() for warning in file.warning_problems)
            resolved[field] = file.id
            continue
        local = LocalFile.read(value)
        existing = local.reusable(client.files.list(sha256=local.sha256), columns)
        if existing is not None:
            resolved[field] = existing.id
            note(f"{field} {value}: the API has it already as {existing.id}")
            continue
        checked = client.files.check(value, purpose=purpose, task_name=task_name, columns=columns)
        note(
            f"{field} {value}: checked by the API, not uploaded (dry run): {json.dumps(checked['checks'])}, "
            f"{checked['rows']} rows"
        )
        complete = False
    return resolved, complete


COMMANDS = (files,)
