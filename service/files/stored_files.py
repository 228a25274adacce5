"""Uploaded files' bytes in the store that no row holds: removed when an upload fails, swept at start.

An upload's bytes are stored first and its row written second, so a file is visible only once both
exist (service/routes/files.py). A write that fails in between removes the bytes again
(`remove_unheld`); a process that dies in between cannot, so every API start sweeps the objects
under files/ that no row holds (`sweep_orphans`), leaving those younger than GLUEJOBS_ORPHAN_GRACE_S:
they may belong to an upload another API process is finishing. A local store's half-written copies
(`<sha256>.<hex>.partial`, of a process killed in the middle of a write) go the same way; S3 writes
an object whole or not at all.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shared.core.db import Database, read
from shared.core.storage import FILES, Store, file_key
from shared.core.tables import File, utcnow

logger = logging.getLogger(__name__)

# files/<sha256>, or a local store's partial copy of one: files/<sha256>.<hex>.partial
SWEEP_BATCH = 500
_OBJECT = re.compile(r"(?P<sha256>[0-9a-f]{64})(?P<partial>\.[0-9a-f]+\.partial)?")


def is_held(session: Session, sha256: str) -> bool:
    """Whether some uploaded file's row holds these bytes."""
    with read(session):
        count = session.scalar(select(func.count()).select_from(File).where(File.sha256 == sha256))
    return bool(count)


def remove_unheld(session: Session, store: Store, sha256: str) -> None:
    """After a failed upload: its bytes leave the store unless another file's row holds them."""
    session.rollback()
    if not is_held(session, sha256):
        store.delete(file_key(sha256))


def _held(db: Database, sha256s: list[str]) -> set[str]:
    """Which of these contents some file's row holds: a query per SWEEP_BATCH, not per object."""
    held: set[str] = set()
    with db.session() as session, read(session):
        for start in range(0, len(sha256s), SWEEP_BATCH):
            batch = sha256s[start : start + SWEEP_BATCH]
            held.update(session.scalars(select(File.sha256).where(File.sha256.in_(batch)).distinct()))
    return held


def sweep_orphans(db: Database, store: Store, *, grace_s: float) -> int:
    """Remove the objects under files/ that no row holds and that are older than `grace_s`; how many."""
    cutoff = utcnow() - timedelta(seconds=grace_s)
    old: dict[str, str] = {}  # path under files/ -> the sha256 it holds ("" for a partial copy)
    for stored in store.list(FILES):
        name = _OBJECT.fullmatch(stored.path)
        if name is not None and stored.modified <= cutoff:
            old[stored.path] = "" if name["partial"] else name["sha256"]
    held = _held(db, sorted({sha256 for sha256 in old.values() if sha256}))
    removed = 0
    for path, sha256 in old.items():
        if sha256 not in held:
            store.delete(f"{FILES}/{path}")
            removed += 1
    if removed:
        logger.info("removed %d object(s) under %s/ that no uploaded file holds", removed, FILES)
    return removed
