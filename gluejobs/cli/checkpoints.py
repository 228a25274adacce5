"""`gluejobs checkpoints ls|prune`: a job's checkpoints, and the removal of a finished job's ones to
free its owner's storage (DELETE /v1/jobs/{id}/checkpoints)."""

from __future__ import annotations

import click

from gluejobs.cli.base import ClientCommand, Group, Invocation
from gluejobs.cli.output import human_bytes
from shared.wire.job_folder import checkpoint_name

JOB_ID = click.argument("job_id", type=int, metavar="JOB")


@click.group("checkpoints", cls=Group)
def checkpoints() -> None:
    """A job's checkpoints: ls, prune."""


@checkpoints.command("ls", cls=ClientCommand, json="the checkpoints (a list)")
@JOB_ID
def ls(api: Invocation, job_id: int) -> None:
    """The job's declared checkpoints, oldest first, best marked."""
    with api.client() as client:
        found = client.jobs.checkpoints(job_id)
    lines = [
        f"{checkpoint_name(c.step)}  epoch {c.epoch:g}"
        + ("  best" if c.is_best else "")
        + "".join(f"  {name} {value:.4g}" for name, value in sorted(c.metrics.items()))
        for c in found
    ]
    api.show([c.raw for c in found], lines or f"job {job_id} has no checkpoints")


@checkpoints.command("prune", cls=ClientCommand, json="what was removed and kept")
@JOB_ID
@click.option(
    "--keep",
    "keep",
    multiple=True,
    metavar="NAME",
    help="A checkpoint to keep (checkpoint-300); repeat it, or give several comma-separated. "
    "Without it: the best checkpoint (and, for a job that did not succeed, its newest).",
)
@click.option("--keep-none", is_flag=True, help="Keep no checkpoint (the final model stays).")
def prune(api: Invocation, job_id: int, keep: tuple[str, ...], keep_none: bool) -> None:
    """Remove a finished job's checkpoints to free storage.

    Frees its owner's storage in the store. Its final model, predictions and logs stay. A queued
    or running job is refused: cancel it first."""
    if keep and keep_none:
        click.get_current_context().fail("give --keep or --keep-none, not both")
    names = [name.strip() for value in keep for name in value.split(",") if name.strip()]
    with api.client() as client:
        done = client.jobs.prune_checkpoints(job_id, keep=[] if keep_none else (names or None))
    removed = ", ".join(done.removed) or "nothing"
    kept = ", ".join(done.kept) or "none"
    api.show(
        done.raw,
        f"job {done.job_id}: removed {removed} ({human_bytes(done.freed_bytes)}); kept {kept}",
    )


COMMANDS = (checkpoints,)
