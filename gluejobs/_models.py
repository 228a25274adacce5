"""Registering a model folder, as both clients do it, without I/O to the API: the folder is packed
into an uncompressed tar on this machine's disk, which the request (gluejobs/resources/models.py)
sends as its part `file`.

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
