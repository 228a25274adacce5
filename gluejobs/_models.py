"""Registering a model folder, as both clients do it, without I/O to the API: the folder is packed
into an uncompressed tar on this machine's disk, which the request sends as its part `file`.

Hidden entries (`.git`, `.cache`, `.gitattributes` of a folder cloned from the Hub) stay behind;
everything else goes as it is, links included, so the API's checks (no links, no code, only a
model folder's files) decide, and name what they refuse.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from gluejobs._core import Call, query
from gluejobs._files import UPLOAD_TIMEOUT
from gluejobs._types import ApiError


@contextmanager
def packed_folder(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """`folder` as a tar in a temporary folder, removed afterwards."""
    local = Path(folder).expanduser()
    if not local.is_dir():
        raise ApiError(0, "invalid_file", f"{str(folder)!r} is not a folder on this machine", field="file")
    with tempfile.TemporaryDirectory(prefix="gluejobs-model-") as scratch:
        tar_path = Path(scratch) / f"{local.name or 'model'}.tar"
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as archive:
            for path in sorted(local.rglob("*")):
                relative = path.relative_to(local)
                if any(part.startswith(".") for part in relative.parts):
                    continue
                archive.add(path, arcname=relative.as_posix(), recursive=False)
        yield tar_path


def upload_call(tar_path: Path, name: str) -> Call:
    # Not idempotent: a retry after the API stored the model would answer 409 (the name is taken).
    return Call(
        "POST", "/v1/models", upload=tar_path, form={"name": name}, timeout=UPLOAD_TIMEOUT, idempotent=False
    )


def models_call(page_size: int) -> Call:
    return Call("GET", "/v1/models", params=query(limit=page_size))


def model_path(name: str, owner: str | None) -> tuple[str, dict[str, str] | None]:
    return f"/v1/models/{quote(name, safe='')}", query(owner=owner) or None


def promote_call(job_id: int, name: str, checkpoint: str | int | None) -> Call:
    """POST /v1/jobs/{id}/model: the job's model (or a checkpoint: `checkpoint-300`, 300, `best`)
    registered as `model:NAME`; the store copies its files, nothing is sent but the names."""
    body = {"name": name, "checkpoint": None if checkpoint is None else str(checkpoint)}
    # Not idempotent: a retry after the API registered it would answer 409 (the name is taken).
    return Call("POST", f"/v1/jobs/{int(job_id)}/model", json=body, idempotent=False)
