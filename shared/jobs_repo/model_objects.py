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
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from shared.core.db import Database
from shared.core.faults import crash_point
from shared.core.storage import MODELS, Store, model_blob_key, model_manifest_key
from shared.core.tables import utcnow
from shared.jobs_repo.models import held_objects
from shared.jobspec.registered_models import ManifestFile, manifest_bytes, manifest_sha256

logger = logging.getLogger(__name__)

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
    if sha256 not in manifests:
        store.delete(model_manifest_key(sha256))
    for blob in sorted({entry.sha256 for entry in files} - blobs):
        store.delete(model_blob_key(blob))


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
    held = {"blobs": blobs, "manifests": manifests}
    removed = 0
    for path, name in old:
        if name["partial"] or name["sha256"] not in held[name["kind"]]:
            store.delete(f"{MODELS}/{path}")
            removed += 1
    if removed:
        logger.info("removed %d object(s) under %s/ that no registered model holds", removed, MODELS)
    return removed
