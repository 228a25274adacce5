"""A registered model's objects in the store: written with dedup within its owner only, removed when
its row is not written, swept at start when a process died in between.

The objects (models/blobs/<sha256>, models/manifests/<sha256>.json) are keyed by content, shared by
every model that holds the same bytes. An upload writes every object that none of its OWNER's models
holds, whether or not another owner's does: the store's work and the answer's time are those of new
bytes, so an upload cannot learn what another owner has (an `exists` before the put took 5 s for
known bytes against 20 s for new ones on S3). After the row is written, an object that is missing
(the last other model holding it was deleted meanwhile) is put again, as uploaded files do.

A row write that fails (a name taken by a racing upload, the database away) removes the objects no
row holds; a process that dies in between cannot, so every API start sweeps the objects under models/
that no row holds, and a local store's half-written copies (`<name>.<hex>.partial`), leaving those
younger than GLUEJOBS_ORPHAN_GRACE_S: they may belong to an upload another API process is finishing.

Another job's model (`job:17`, a spec's or promote's source: shared/jobspec/job_sources.py) becomes
such objects too, by `store_job_model`: the manifest the worker wrote beside the model names every
file with its sha256, and the store copies each missing file from the job's folder to its blob itself
(S3 CopyObject, Store.copy): no byte passes through the API. A job that names it pins it:
models/pins/<sha256>.json (the manifest again) keeps its manifest and blobs through the sweep and
through a model's deletion, for good, so a rerun reads the same bytes after the source job (or a
promoted model holding the same files) is deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
import threading
from datetime import timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from shared.core.db import Database
from shared.core.errors import InvalidSpec
from shared.core.faults import crash_point
from shared.core.storage import MODELS, Store, model_blob_key, model_manifest_key
from shared.core.tables import utcnow
from shared.jobs_repo.models import JobModelFiles, find_job_model, held_objects
from shared.jobspec.job_sources import JobSource, is_model_file, record_name
from shared.jobspec.registered_models import (
    ManifestFile,
    RegisteredModel,
    manifest_bytes,
    manifest_sha256,
    read_manifest,
)
from shared.wire.job_folder import MANIFEST_NAME, job_key

logger = logging.getLogger(__name__)

PINS = f"{MODELS}/pins"
# At most this many jobs' models are copied in the store at once (each request's thread waits its turn).
COPIES_AT_ONCE = 2
_copying = threading.BoundedSemaphore(COPIES_AT_ONCE)
# A manifest the worker wrote is small (a path, size and hash per file); a larger one is not read.
MAX_MANIFEST_BYTES = 1024 * 1024

# models/blobs/<sha256>, models/manifests/<sha256>.json, or a local store's partial copy of either
_OBJECT = re.compile(
    r"(?P<kind>blobs|manifests)/(?P<sha256>[0-9a-f]{64})(?:\.json)?(?P<partial>\.[0-9a-f]+\.partial)?"
)


def store_model(
    folder: Path, files: list[ManifestFile], store: Store, session: Session, owner: str | None
) -> str:
    """Put the folder's files and then its manifest into the store, but those the owner's own models
    hold already; the manifest last, so a manifest in the store always has its files. Its sha256."""
    own_blobs, own_manifests = held_objects(session, owner=owner)
    for entry in files:
        if entry.sha256 not in own_blobs:
            store.put(folder / entry.path, model_blob_key(entry.sha256))
    sha256 = manifest_sha256(files)
    if sha256 not in own_manifests:
        _put_manifest(folder, files, store, sha256)
    crash_point("after_model_put")  # tests: an API killed between the store and the database
    return sha256


def _put_manifest(folder: Path, files: list[ManifestFile], store: Store, sha256: str) -> None:
    manifest = folder.with_name(f"{folder.name}.manifest.json")
    try:
        manifest.write_bytes(manifest_bytes(files))
        store.put(manifest, model_manifest_key(sha256))
    finally:
        manifest.unlink(missing_ok=True)


def restore_missing(folder: Path, files: list[ManifestFile], store: Store, sha256: str) -> None:
    """After the row is written: put again an object that another model's deletion took meanwhile."""
    for entry in files:
        if not store.exists(model_blob_key(entry.sha256)):
            store.put(folder / entry.path, model_blob_key(entry.sha256))
    if not store.exists(model_manifest_key(sha256)):
        _put_manifest(folder, files, store, sha256)


def remove_unheld(session: Session, store: Store, files: list[ManifestFile], sha256: str) -> None:
    """After a failed row write: the model's objects leave the store unless a row holds them."""
    session.rollback()
    blobs, manifests = held_objects(session, everyone=True)
    pinned_blobs, pinned_manifests = pinned_objects(store)
    blobs |= pinned_blobs
    manifests |= pinned_manifests
    if sha256 not in manifests:
        store.delete(model_manifest_key(sha256))
    for blob in sorted({entry.sha256 for entry in files} - blobs):
        store.delete(model_blob_key(blob))


def pin_key(sha256: str) -> str:
    return f"{PINS}/{sha256}.json"


def job_model_manifest(store: Store, found: JobModelFiles, *, field: str) -> list[ManifestFile]:
    """The files of a job's model, from the manifest the worker wrote beside it. A model saved before
    workers wrote one (no manifest) is hashed here once, read from the store in pieces."""
    folder = job_key(found.job_id, found.folder)
    try:
        data = store.read(f"{folder}/{MANIFEST_NAME}", end=MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        with _copying:  # the API reads the files: as bounded as the copies
            return _hashed(store, folder, found, field=field)
    try:
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError("too large")
        files = read_manifest(data, hashlib.sha256(data).hexdigest())
    except (ValueError, KeyError, TypeError):
        raise InvalidSpec(f"{found.reference}: its model's manifest is unreadable", field=field) from None
    if not files:
        raise InvalidSpec(f"{found.reference}: the job's folder holds no model files", field=field)
    return files


def _hashed(store: Store, folder: str, found: JobModelFiles, *, field: str) -> list[ManifestFile]:
    files = []
    for stored in store.list(folder):
        if "/" in stored.path or not is_model_file(stored.path):
            continue
        digest = hashlib.sha256()
        with store.open(f"{folder}/{stored.path}") as handle:
            while chunk := handle.read(8 * 1024 * 1024):
                digest.update(chunk)
        files.append(ManifestFile(path=stored.path, bytes=stored.size, sha256=digest.hexdigest()))
    if not files:
        raise InvalidSpec(f"{found.reference}: the job's folder holds no model files", field=field)
    return files


def store_job_model(
    store: Store, found: JobModelFiles, files: list[ManifestFile], *, scratch: Path, pin: bool
) -> str:
    """Make the job's model a content-addressed model: each file the store lacks is copied by the
    store from the job's folder to its blob, then the manifest is put (last, as uploads do) and, with
    `pin`, the pin that keeps them. Its sha256. At most COPIES_AT_ONCE at once."""
    sha256 = manifest_sha256(files)
    data = manifest_bytes(files)
    folder = job_key(found.job_id, found.folder)
    if pin and store.exists(pin_key(sha256)):  # pinned once: its manifest and blobs stay for good
        return sha256
    with _copying:
        for entry in files:
            if not store.exists(model_blob_key(entry.sha256)):
                store.copy(f"{folder}/{entry.path}", model_blob_key(entry.sha256))
        keys = [model_manifest_key(sha256), *([pin_key(sha256)] if pin else [])]
        missing = [key for key in keys if not store.exists(key)]
        if missing:
            scratch.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=scratch, prefix="manifest-") as staging:
                local = Path(staging) / "manifest.json"
                local.write_bytes(data)
                for key in missing:
                    store.put(local, key)
    return sha256


def job_model(
    session: Session,
    store: Store,
    *,
    source: JobSource,
    caller: str | None,
    scratch: Path,
    pin: bool,
    field: str = "spec.model_name_or_path",
) -> tuple[RegisteredModel, list[ManifestFile]]:
    """The record of the job's model `source` names (found through the one ownership check: `caller`
    is the owner a non-admin caller must be), made a content-addressed model in the store; its files."""
    found = find_job_model(session, source=source, caller=caller, field=field, adapters=True)
    files = job_model_manifest(store, found, field=field)
    sha256 = store_job_model(store, found, files, scratch=scratch, pin=pin)
    record = RegisteredModel(
        name=record_name(found.job_id, found.step),
        owner=found.owner,
        sha256=sha256,
        bytes=sum(entry.bytes for entry in files),
        job=found.job_id,
        checkpoint=found.folder.rpartition("/")[2] if found.step is not None else None,
        # A LoRA job's adapter: the base the worker loads it onto, pinned as the LoRA job pinned it.
        base_model_name_or_path=found.base_model_name_or_path,
        base_model=RegisteredModel.model_validate(found.base_model) if found.base_model else None,
    )
    if pin:
        _pin_bases(store, record, field=field)
    return record, files


def _pin_bases(store: Store, record: RegisteredModel, *, field: str) -> None:
    """A LoRA adapter's stored base (and its base's, …) is pinned beside the adapter: the base's
    deletion keeps the bytes a job from the adapter loads."""
    base = record.base_model
    while base is not None:
        if not store.exists(pin_key(base.sha256)):
            try:
                store.copy(model_manifest_key(base.sha256), pin_key(base.sha256))
            except FileNotFoundError:
                raise InvalidSpec(
                    f"job {record.job}'s LoRA adapter was trained on {base.name}, whose files are no longer "
                    "in the store",
                    field=field,
                ) from None
        base = base.base_model


def pinned_objects(store: Store) -> tuple[set[str], set[str]]:
    """(the sha256 of the files, those of the manifests) that jobs' pinned models hold."""
    blobs: set[str] = set()
    manifests: set[str] = set()
    for stored in store.list(PINS):
        sha256 = stored.path.removesuffix(".json")
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            continue
        try:
            files = read_manifest(store.read(pin_key(sha256)), sha256)
        except FileNotFoundError:
            continue
        except (ValueError, KeyError, TypeError):  # not a manifest: its bytes cannot be named
            logger.warning("the pin %s is not a manifest of its hash", sha256[:12])
            continue
        manifests.add(sha256)
        blobs.update(entry.sha256 for entry in files)
    return blobs, manifests


def read_model_type(store: Store, files: list[ManifestFile]) -> str:
    """config.json's model_type, read from its blob ("unknown" without one)."""
    config = next((entry for entry in files if entry.path == "config.json"), None)
    if config is None:
        return "unknown"
    try:
        value = json.loads(store.read(model_blob_key(config.sha256))).get("model_type")
    except (ValueError, AttributeError):
        return "unknown"
    return str(value) if isinstance(value, str) and value else "unknown"


def sweep_model_orphans(db: Database, store: Store, *, grace_s: float) -> int:
    """Remove the objects under models/ that no row holds and that are older than `grace_s`, partial
    copies included; how many."""
    cutoff = utcnow() - timedelta(seconds=grace_s)
    old = [
        (stored.path, name)
        for stored in store.list(MODELS)
        if (name := _OBJECT.fullmatch(stored.path)) is not None and stored.modified <= cutoff
    ]
    if not old:  # the database is not asked (a store without models, a database not migrated yet)
        return 0
    with db.session() as session:
        blobs, manifests = held_objects(session, everyone=True)
    pinned_blobs, pinned_manifests = pinned_objects(store)
    held = {"blobs": blobs | pinned_blobs, "manifests": manifests | pinned_manifests}
    removed = 0
    for path, name in old:
        if name["partial"] or name["sha256"] not in held[name["kind"]]:
            store.delete(f"{MODELS}/{path}")
            removed += 1
    if removed:
        logger.info("removed %d object(s) under %s/ that no model or pin holds", removed, MODELS)
    return removed
