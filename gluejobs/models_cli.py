"""`gluejobs models upload|ls|rm`: model folders registered once, named in a spec as `model:NAME`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gluejobs.client import Client, ModelInfo
from gluejobs.output import print_json

AddClientCommand = Callable[..., argparse.ArgumentParser]


def add_commands(commands: Any, client_command: AddClientCommand) -> None:
    models = commands.add_parser("models", help="registered models: upload, ls, rm")
    actions = models.add_subparsers(dest="models_command", required=True)
    upload = client_command(
        actions, "upload", help="register a local model folder (config, tokenizer, weights) under a name"
    )
    upload.add_argument("folder")
    upload.add_argument("--name", required=True, help="its name; a job names it model:NAME")
    ls = client_command(actions, "ls", help="your registered models, newest first")
    ls.add_argument("--json", action="store_true", help="the models as one JSON list")
    remove = client_command(actions, "rm", help="delete a registered model (refused while a job uses it)")
    remove.add_argument("name")
    remove.add_argument("--owner", help="admins: another owner's model of that name")


def run_models(args: argparse.Namespace, client: Client) -> int:
    if args.models_command == "upload":
        model = client.models.upload(args.folder, name=args.name)
        print(_line(model))
        print(f'name it in a job: "model_name_or_path": "{model.model_name_or_path}"')
        return 0
    if args.models_command == "ls":
        models = list(client.models.list())
        if args.json:
            print_json([model.raw for model in models])
        else:
            print("\n".join(_line(model) for model in models) if models else "no models")
        return 0
    client.models.delete(args.name, owner=args.owner)
    print(f"model {args.name} deleted")
    return 0


def _line(model: ModelInfo) -> str:
    return (
        f"{model.model_name_or_path}  {model.model_type}  {len(model.files)} files  "
        f"{model.bytes / 1e6:.1f} MB  sha256 {model.sha256[:12]}…"
    )
