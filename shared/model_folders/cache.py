"""This machine's copies of registered models: fetched from the store by hash, checked before use.

A worker keeps a registered model whole at GLUEJOBS_CACHE_DIR/models/<sha256>/ and loads it from
there; the API keeps only its config and tokenizer files, at models/<sha256>.tokenizer/, which is
all its checks and dry runs read. A folder is fetched beside its place and renamed into it once
whole, so a half-fetched model is never loaded. Before every use each file is hashed against the
manifest (kept in the folder as MANIFEST_FILE): a corrupted or truncated copy is removed and
fetched again, and a copy that the store itself gives wrong is an error (CorruptModel), never loaded.
Hashing costs a read of the weights per job (about a second for a 440 MB BERT-base), little beside
loading them.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from pathlib import Path

from shared.core.storage import Store, StoreUnavailable, model_blob_key, model_manifest_key
from shared.data.local_copies import sha256_of_file
from shared.jobspec.registered_models import ManifestFile, read_manifest
from shared.model_folders.uploads import is_tokenizer_file

logger = logging.getLogger(__name__)

MANIFEST_FILE = ".gluejobs-manifest.json"


class CorruptModel(StoreUnavailable):
    """A registered model's files in the store do not match their hashes (the store's fault: a job is
    retried, a request answered 503)."""


def cached_model(store: Store, cache_dir: Path, sha256: str, *, tokenizer_only: bool = False) -> Path:
    """The folder of the registered model `sha256` on this machine, checked, fetched when missing or
    corrupt. `tokenizer_only`: its config and tokenizer files alone (the API's checks)."""
    folder = cache_dir / "models" / (f"{sha256}.tokenizer" if tokenizer_only else sha256)
    if folder.is_dir():
        if _intact(folder, sha256, tokenizer_only=tokenizer_only):
            return folder
        logger.warning("the cached copy of model %s is corrupt or incomplete: fetching it again", sha256[:12])
        shutil.rmtree(folder, ignore_errors=True)
    _fetch(store, folder, sha256, tokenizer_only=tokenizer_only)
    return folder


def _wanted(files: list[ManifestFile], tokenizer_only: bool) -> list[ManifestFile]:
    return [f for f in files if is_tokenizer_file(f.path)] if tokenizer_only else files


def _intact(folder: Path, sha256: str, *, tokenizer_only: bool) -> bool:
    try:
        files = read_manifest((folder / MANIFEST_FILE).read_bytes(), sha256)
    except (OSError, ValueError):
        return False
    for entry in _wanted(files, tokenizer_only):
        path = folder / entry.path
        try:
            if path.stat().st_size != entry.bytes or sha256_of_file(path) != entry.sha256:
                return False
        except OSError:
            return False
    return True


def _fetch(store: Store, folder: Path, sha256: str, *, tokenizer_only: bool) -> None:
    started = time.perf_counter()
    with store.open(model_manifest_key(sha256)) as handle:
        data = handle.read()
    try:
        files = read_manifest(data, sha256)
    except ValueError as exc:
        raise CorruptModel(f"the store's manifest of model {sha256}: {exc}") from None
    staging = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}.partial")
    try:
        for entry in _wanted(files, tokenizer_only):
            target = staging / entry.path
            _fetch_blob(store, entry.sha256, target)
            if sha256_of_file(target) != entry.sha256:
                raise CorruptModel(
                    f"the store's copy of {entry.path} of model {sha256} does not match its sha256"
                )
        (staging / MANIFEST_FILE).write_bytes(data)
        try:
            os.rename(staging, folder)
        except OSError:  # another process of this machine fetched it meanwhile: theirs is as good
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info(
        "fetched model %s (%d files, %.1f MB) from the store in %.2f s",
        sha256[:12],
        len(files),
        sum(f.bytes for f in _wanted(files, tokenizer_only)) / 1e6,
        time.perf_counter() - started,
    )


def _fetch_blob(store: Store, sha256: str, target: Path) -> None:
    # Copied, never hard-linked to the local store's file: a copy damaged here must not damage the
    # store's, which every other machine and model fetches from.
    store.get(model_blob_key(sha256), target)
