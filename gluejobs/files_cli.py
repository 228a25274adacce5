"""`gluejobs files ls|upload|rm`, and what `gluejobs submit` does with files on this machine.

`gluejobs submit … --train_file ./mine.csv`: a spec file that names a file on this machine is
uploaded first — hashed, and sent only when the API does not hold those bytes already — and the job
is submitted with its id. With `--dry-run` nothing is kept: each local file is checked by the API
(`POST /v1/files?dry_run=true`) and the checks are printed; the job's plan follows when the API
already holds every such file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from gluejobs._files import PURPOSE_OF_FIELD, LocalFile, is_local_file
from gluejobs.client import Client, FileInfo
from gluejobs.output import print_json, print_warnings

AddClientCommand = Callable[..., argparse.ArgumentParser]


def add_commands(commands: Any, client_command: AddClientCommand) -> None:
    files = commands.add_parser("files", help="uploaded data files: ls, upload, rm")
    actions = files.add_subparsers(dest="files_command", required=True)
    ls = client_command(actions, "ls", help="your uploaded files, newest first")
    ls.add_argument("--json", action="store_true", help="the files as one JSON list")
    upload = client_command(actions, "upload", help="upload a data file (not sent again if the API has it)")
    upload.add_argument("path")
    upload.add_argument("--purpose", choices=tuple(PURPOSE_OF_FIELD.values()), default="train")
    upload.add_argument("--task-name", help="check its labels against this GLUE task")
    remove = client_command(actions, "rm", help="delete an uploaded file (refused while a job uses it)")
    remove.add_argument("file_id")


def run_files(args: argparse.Namespace, client: Client) -> int:
    if args.files_command == "ls":
        files = list(client.files.list())
        if args.json:
            print_json([file.raw for file in files])
        else:
            print("\n".join(_line(file) for file in files) if files else "no files")
        return 0
    if args.files_command == "upload":
        file = client.files.create(args.path, purpose=args.purpose, task_name=args.task_name)
        print(_line(file))
        print_warnings(warning.line() for warning in file.warning_problems)
        return 0
    client.files.delete(args.file_id)
    print(f"{args.file_id} deleted")
    return 0


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
        if not dry_run:
            file = client.files.create(value, purpose=purpose, task_name=task_name)
            print(
                f"{field} {value}: {file.id} ({file.bytes} bytes, sha256 {file.sha256[:12]}…)",
                file=sys.stderr,
            )
            print_warnings(warning.line() for warning in file.warning_problems)
            resolved[field] = file.id
            continue
        local = LocalFile.read(value)
        existing = local.reusable(client.files.list(sha256=local.sha256))
        if existing is not None:
            resolved[field] = existing.id
            print(f"{field} {value}: the API has it already as {existing.id}", file=sys.stderr)
            continue
        checked = client.files.check(value, purpose=purpose, task_name=task_name)
        print(
            f"{field} {value}: checked by the API, not uploaded (dry run): {json.dumps(checked['checks'])}, "
            f"{checked['rows']} rows",
            file=sys.stderr,
        )
        complete = False
    return resolved, complete
