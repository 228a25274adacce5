"""How a message names a job's files for the person who reads it: the API path that serves them and
the `gluejobs download` command that fetches them, never the worker's own folder or the store's
URI, which mean nothing on the reader's laptop (operators find those in the worker's log lines).
The client's command line words its own lines alike (gluejobs/cli/job_view.py)."""

from __future__ import annotations


def artifact_path(job_id: int, relative: str = "") -> str:
    """The API path of a job's file (or of the listing of its files, `relative` empty)."""
    return f"/v1/jobs/{job_id}/artifacts" + (f"/{relative}" if relative else "")


def download_command(job_id: int, *, checkpoint: int | None = None) -> str:
    """The command that downloads the job's final model (or a checkpoint) into a folder."""
    step = f" --checkpoint {checkpoint}" if checkpoint is not None else ""
    return f"gluejobs download {job_id} DIR{step}"
