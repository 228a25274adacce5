"""The search driver's thread in each API process (shared/searches/driver.py does the work).

Every API process runs one; a lease in the database lets one of them drive a given search at a
time. When the process stops it hands its searches back, so that another process (or the next
start of this one) takes them over at once; a process that is killed loses them after
GLUEJOBS_SEARCH_LEASE_S.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from sqlalchemy.exc import SQLAlchemyError

from shared.core.config import Settings
from shared.core.db import Database
from shared.searches import store

logger = logging.getLogger(__name__)


class SearchDriverThread:
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db, self.settings = db, settings
        self.driver_id = f"api:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="search-driver", daemon=True)
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        try:
            with self.db.session() as session:
                store.release_leases(session, driver_id=self.driver_id)
        except SQLAlchemyError as exc:  # the leases run out on their own
            logger.warning("search driver: could not hand back its searches (%s)", exc)

    def _run(self) -> None:
        from shared.searches.driver import drive_once  # Optuna loads here, not with the app

        while not self._stop.is_set():
            try:
                drive_once(self.db, self.settings, driver_id=self.driver_id)
                self._failing = False
            except SQLAlchemyError as exc:  # the database away, or not migrated yet: try again later
                if not self._failing:
                    logger.warning("search driver: %s", str(exc).splitlines()[0])
                self._failing = True
            self._stop.wait(self.settings.search_poll_s)
