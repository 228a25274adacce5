"""The job process's Reporter: rows are queued and written by a background thread that rides out
database outages, so the training loop never waits on the database.

- Order kept: one FIFO queue, one writer; an operation leaves the queue only once it committed.
- Retries: a write that fails because the database is away or busy (shared.core.db_retries.is_transient)
  is retried with capped, jittered backoff until it commits. Every write is idempotent (metric rows
  by (job, split, name, step), checkpoints by (job, step), events by their dedup key), so a write
  that committed but whose acknowledgement was lost adds nothing when it is retried.
- Bounded memory: at MAX_PENDING queued operations, the training loop waits for room (it only
  fills in an outage long enough to have lost the lease anyway).
- Fenced: every write carries the attempt's Claim. A refused write (StaleClaim: another attempt
  owns the job now) stops this process at once: nothing it does from then on may count.
- A checkpoint is declared only once everything before it is written (`checkpoint` flushes and
  waits); the end of the job flushes too (`close`).
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from shared import jobs_repo
from shared.core.db import Database
from shared.core.db_retries import Backoff, is_transient
from shared.core.errors import StaleClaim
from shared.jobs_repo import Claim, MetricRow

logger = logging.getLogger(__name__)

MAX_PENDING = 10_000
# The exit status of a job process whose claim was taken over (its writes were refused).
STALE_EXIT = 76
# An outage is logged when it starts and then at most this often.
OUTAGE_LOG_INTERVAL_S = 10.0

Operation = Callable[[Session], Any]


def exit_stale(error: StaleClaim) -> None:
    logger.error("%s: this attempt stops now", error.message)
    logging.shutdown()
    os._exit(STALE_EXIT)


class QueuedReporter:
    """worker.training.loop's Reporter, writing through a background flusher (see the module)."""

    def __init__(
        self,
        db: Database,
        claim: Claim,
        *,
        max_pending: int = MAX_PENDING,
        backoff: Backoff | None = None,
        on_stale: Callable[[StaleClaim], None] = exit_stale,
    ) -> None:
        self.db = db
        self.claim = claim
        self._max_pending = max_pending
        self._backoff = backoff or Backoff(base_s=0.1, cap_s=5.0)
        self._on_stale = on_stale
        self._pending: deque[tuple[str, Operation]] = deque()
        self._changed = threading.Condition()
        self._closing = False
        self._failure: BaseException | None = None
        self._sequence = itertools.count(1)
        self._process_token = secrets.token_hex(6)
        self._thread = threading.Thread(target=self._flush_forever, name="gluejobs-flusher", daemon=True)
        self._thread.start()

    # --- the Reporter protocol ----------------------------------------------------------------------

    def log(self, message: str, *, level: str = "info", data: dict[str, Any] | None = None) -> None:
        key = self._dedup_key()
        self._put(
            "event",
            lambda s: jobs_repo.add_event(
                s,
                job_id=self.claim.job_id,
                message=message,
                level=level,
                data=data,
                claim=self.claim,
                dedup_key=key,
            ),
        )

    def metrics(
        self, *, step: int, epoch: float, split: str, values: dict[str, float], best_metric: str | None = None
    ) -> None:
        rows = [MetricRow(epoch=epoch, step=step, split=split, name=k, value=v) for k, v in values.items()]
        self._put(
            "metrics",
            lambda s: jobs_repo.add_metrics(
                s, job_id=self.claim.job_id, rows=rows, best_metric=best_metric, claim=self.claim
            ),
        )

    def checkpoint(
        self, *, step: int, epoch: float, path: str, metrics: dict[str, float], is_best: bool
    ) -> None:
        """Declared once every row before it is written; returns only then (and never for a stale
        attempt: the process stops first, before it could rotate away the next attempt's files)."""
        key = self._dedup_key()
        self._put(
            "checkpoint",
            lambda s: jobs_repo.add_checkpoint(
                s,
                job_id=self.claim.job_id,
                step=step,
                epoch=epoch,
                path=path,
                metrics=metrics,
                is_best=is_best,
                claim=self.claim,
                dedup_key=key,
            ),
        )
        self.flush()

    def checkpoints_deleted(self, steps: list[int]) -> None:
        key = self._dedup_key()
        self._put(
            "checkpoints_deleted",
            lambda s: jobs_repo.delete_checkpoints(
                s, job_id=self.claim.job_id, steps=steps, claim=self.claim, dedup_key=key
            ),
        )

    # --- beyond the protocol ------------------------------------------------------------------------

    def environment(self, environment: dict[str, Any]) -> None:
        self._put(
            "environment",
            lambda s: jobs_repo.set_environment(
                s, job_id=self.claim.job_id, environment=environment, claim=self.claim
            ),
        )

    def result(self, result: dict[str, Any]) -> None:
        self._put(
            "result",
            lambda s: jobs_repo.set_result(s, job_id=self.claim.job_id, result=result, claim=self.claim),
        )

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far is written; False on timeout. Raises the flusher's
        failure (a write that can never succeed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while self._pending and self._failure is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(remaining)
            self._raise_failure()
        return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Flush, then stop the flusher; whether everything was written."""
        try:
            return self.flush(timeout_s)
        finally:
            with self._changed:
                self._closing = True
                self._changed.notify_all()

    @property
    def pending(self) -> int:
        with self._changed:
            return len(self._pending)

    # --- the flusher --------------------------------------------------------------------------------

    def _dedup_key(self) -> str:
        # Unique per process, not only per attempt: a job handed back at shutdown keeps its attempt
        # number, and the next process's events must not be taken for repeats of this one's.
        return f"{self.claim.attempt}-{self._process_token}-{next(self._sequence)}"

    def _put(self, kind: str, operation: Operation) -> None:
        with self._changed:
            self._raise_failure()
            while len(self._pending) >= self._max_pending and self._failure is None:
                self._changed.wait()
            self._raise_failure()
            self._pending.append((kind, operation))
            self._changed.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _flush_forever(self) -> None:
        outage_since: float | None = None
        logged_at = 0.0
        while True:
            with self._changed:
                while not self._pending and not self._closing:
                    self._changed.wait()
                if not self._pending:
                    return
                kind, operation = self._pending[0]
            try:
                with self.db.session() as session:
                    operation(session)
            except StaleClaim as exc:
                self._fail(exc)
                self._on_stale(exc)
                return
            except Exception as exc:
                if not is_transient(exc):
                    logger.exception("job %s: a %s write failed for good", self.claim.job_id, kind)
                    self._fail(exc)
                    return
                now = time.monotonic()
                if outage_since is None or now - logged_at >= OUTAGE_LOG_INTERVAL_S:
                    outage_since = outage_since or now
                    logged_at = now
                    logger.warning(
                        "job %s: the database is unreachable (%s queued, %.0fs so far); retrying: %s",
                        self.claim.job_id,
                        len(self._pending),
                        now - outage_since,
                        str(exc).splitlines()[0][:200],
                    )
                time.sleep(self._backoff.next_delay())
                continue
            if outage_since is not None:
                logger.info(
                    "job %s: the database is back after %.1fs",
                    self.claim.job_id,
                    time.monotonic() - outage_since,
                )
                outage_since = None
            self._backoff.reset()
            with self._changed:
                self._pending.popleft()
                self._changed.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._changed:
            self._failure = exc
            self._changed.notify_all()
