"""This machine's copies of uploaded files: fetched from the store once, checked before every use.

A copy lives at GLUEJOBS_CACHE_DIR/files/<sha[:2]>/<sha256><suffix>
(shared.jobspec.uploaded_files.cache_path), where the API reads it to check a job's data and a worker to train
on it. `local_copy` fetches a missing copy, checks the sha256 of the bytes it is about to hand out, and
fetches again once when they do not match: a truncated or corrupted copy is never read. With the local store
the copy is a hard link to the store's own file where the two share a file system, so the bytes are not
doubled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from pathlib import Path

from shared.core.storage import Store, StoreUnavailable, file_key
from shared.jobspec.uploaded_files import cache_path

logger = logging.getLogger(__name__)


class CorruptFile(StoreUnavailable):
    """An uploaded file's bytes in the store do not match their sha256 (the store's fault: a job is
    retried, a request answered 503)."""


def sha256_of_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def local_copy(store: Store, cache_dir: Path, *, sha256: str, suffix: str) -> Path:
    """A checked local copy of the uploaded bytes `sha256`: fetched when missing or when what is
    there does not hash to `sha256`. CorruptFile when even a fresh copy does not."""
    path = cache_path(cache_dir, sha256, suffix)
    if _matches(path, sha256):
        return path
    if path.exists():
        logger.warning("the local copy of %s is corrupt or truncated: fetching it again", sha256[:12])
        path.unlink(missing_ok=True)
    _fetch(store, sha256, path)
    if not _matches(path, sha256):
        path.unlink(missing_ok=True)
        raise CorruptFile(f"the store's copy of the uploaded file with sha256 {sha256} does not match it")
    return path


def keep_copy(source: Path, cache_dir: Path, *, sha256: str, suffix: str) -> Path:
    """Make `source` (a file just uploaded and checked) this machine's copy of `sha256`."""
    path = cache_path(cache_dir, sha256, suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, path)
    _remember(path, sha256)
    return path


def _fetch(store: Store, sha256: str, path: Path) -> None:
    key = file_key(sha256)
    if store.local_root is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
            os.link(Path(store.path(key)), partial)
            os.replace(partial, path)
            return
        except OSError:  # another file system (or none to link): copy
            pass
    started = time.perf_counter()
    store.get(key, path)
    logger.info(
        "fetched the uploaded file %s (%.1f MB) from the store in %.2f s",
        sha256[:12],
        path.stat().st_size / 1e6,
        time.perf_counter() - started,
    )


# Copies this process has checked: (path, size, mtime) → sha256, so that a job's several reads of
# one file hash it once. A copy changed on disk (size or mtime) is hashed again.
_checked: dict[tuple[str, int, int], str] = {}
_checked_lock = threading.Lock()


def _matches(path: Path, sha256: str) -> bool:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return False
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _checked_lock:
        if _checked.get(key) == sha256:
            return True
    if sha256_of_file(path) != sha256:
        return False
    with _checked_lock:
        _checked[key] = sha256
    return True


def _remember(path: Path, sha256: str) -> None:
    stat = path.stat()
    with _checked_lock:
        _checked[(str(path), stat.st_size, stat.st_mtime_ns)] = sha256
