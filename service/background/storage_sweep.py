"""The API's storage sweep (shared/jobs_repo/storage_usage.sweep_storage), a thread in each API process
beside the search driver: every GLUEJOBS_STORAGE_SWEEP_S it finishes the removals a crash cut short,
applies GLUEJOBS_CHECKPOINT_RETENTION_DAYS, and sizes new checkpoints and finished jobs for the owners'
tally. Several processes may sweep at once: each step is idempotent (a journal row is removed once its
folder is, a size is written once), so they only share the work. Its first pass comes one period after
the start, so a restart loop does not list the store each time.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import SQLAlchemyError

from shared.core.config import Settings
from shared.core.db import Database
from shared.core.storage import Store, StoreUnavailable
from shared.jobs_repo.storage_usage import sweep_storage

logger = logging.getLogger(__name__)


class StorageSweepThread:
    def __init__(self, db: Database, store: Store, settings: Settings) -> None:
        self.db, self.store, self.settings = db, store, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storage-sweep", daemon=True)
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def sweep_once(self) -> dict[str, int] | None:
        """One pass; None when the database or the store was away (the next pass tries again)."""
        try:
            with self.db.session() as session:
                done = self.store.once(
                    lambda quick: sweep_storage(
                        session, quick, retention_days=self.settings.checkpoint_retention_days
                    )
                )
        except (SQLAlchemyError, StoreUnavailable, OSError) as exc:
            if not self._failing:
                logger.warning("storage sweep: %s; the next pass tries again", str(exc).splitlines()[0][:200])
            self._failing = True
            return None
        self._failing = False
        if done["finished"] or done["retained"]:
            logger.info(
                "storage sweep: %d removal(s) finished, %d job(s) past the checkpoint retention",
                done["finished"],
                done["retained"],
            )
        return done

    def _run(self) -> None:
        while not self._stop.wait(self.settings.storage_sweep_s):
            self.sweep_once()
