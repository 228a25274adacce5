"""`gluejobs models upload|promote|ls|rm`: model folders registered once (or a job's model promoted),
named in a spec as `model:NAME`."""

from __future__ import annotations

import click

from gluejobs.cli.base import ClientCommand, Group, Invocation
from gluejobs.client import ModelInfo


@click.group("models", cls=Group)
def models() -> None:
    """Registered models: upload, promote, ls, rm. A job names one as model:NAME."""


@models.command("upload", cls=ClientCommand, json="the model")
@click.argument("folder")
@click.option("--name", required=True, help="Its name; a job names it model:NAME.")
def upload(api: Invocation, folder: str, name: str) -> None:
    """Register a local model folder under a name.

    The folder save_pretrained writes: config, tokenizer, weights."""
    with api.client() as client:
        model = client.models.upload(folder, name=name)
    api.show(
        model.raw, [_line(model), f'name it in a job: "model_name_or_path": "{model.model_name_or_path}"']
    )


@models.command("promote", cls=ClientCommand, json="the model")
@click.argument("job")
@click.option("--name", required=True, help="Its name; a job names it model:NAME.")
@click.option(
    "--checkpoint",
    help="One of the job's declared checkpoints (checkpoint-300, or 300), or best; default: its final model.",
)
def promote(api: Invocation, job: str, name: str, checkpoint: str | None) -> None:
    """Register a job's model under a name, without downloading it.

    JOB is the job's id (17, or job:17). The API's store copies the files."""
    job_id = job.removeprefix("job:")
    if not job_id.isdigit():
        raise click.BadParameter(f"{job!r} is not a job id (17, or job:17)", param_hint="JOB")
    with api.client() as client:
        model = client.models.promote(int(job_id), name=name, checkpoint=checkpoint)
    api.show(
        model.raw, [_line(model), f'name it in a job: "model_name_or_path": "{model.model_name_or_path}"']
    )


@models.command("ls", cls=ClientCommand, json="the models (a list)")
def ls(api: Invocation) -> None:
    """Your registered models, newest first."""
    with api.client() as client:
        found = list(client.models.list())
    api.show([model.raw for model in found], [_line(model) for model in found] or "no models")


@models.command("rm", cls=ClientCommand)
@click.argument("name")
@click.option("--owner", help="Admins: another owner's model of that name.")
def remove(api: Invocation, name: str, owner: str | None) -> None:
    """Delete a registered model.

    Refused while a queued or running job uses it."""
    with api.client() as client:
        client.models.delete(name, owner=owner)
    print(f"model {name} deleted")


def _line(model: ModelInfo) -> str:
    return (
        f"{model.model_name_or_path}  {model.model_type}  {len(model.files)} files  "
        f"{model.bytes / 1e6:.1f} MB  sha256 {model.sha256[:12]}…"
    )


COMMANDS = (models,)
