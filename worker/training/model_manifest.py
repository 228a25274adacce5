"""The manifest a worker writes beside every model it saves (the final model, each checkpoint): the
path, size and sha256 of each of the model's files (shared/jobspec/job_sources.is_model_file), as
canonical JSON (shared/jobspec/registered_models.manifest_bytes), so that its own sha256 is the
model's hash. The API reads it when a spec names the model (`job:17`, `job:17/checkpoint-300`) or a
promote registers it, and has the store copy the files by hash without hashing them itself.

Hashing here costs a read of the files just written, still in the page cache: about 0.1 s for
MiniLM's 90 MB, a second for a 440 MB BERT-base, per save.
"""

from __future__ import annotations

import os
from pathlib import Path

from shared.data.local_copies import sha256_of_file
from shared.jobspec.job_sources import is_model_file
from shared.jobspec.registered_models import ManifestFile, manifest_bytes
from shared.wire.job_folder import MANIFEST_NAME


def write_model_manifest(folder: Path) -> list[ManifestFile]:
    """Write MANIFEST_NAME in `folder` for the model files saved there (top level); the files."""
    files = [
        ManifestFile(path=path.name, bytes=path.stat().st_size, sha256=sha256_of_file(path))
        for path in sorted(folder.iterdir())
        if path.is_file() and is_model_file(path.name)
    ]
    target = folder / MANIFEST_NAME
    partial = target.with_name(f".{MANIFEST_NAME}.partial")
    partial.write_bytes(manifest_bytes(files))
    os.replace(partial, target)
    return files
