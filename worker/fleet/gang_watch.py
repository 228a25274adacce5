"""A gang member's watch over its attempt (issue 37): what the supervisor of a job of several machines
(worker/fleet/supervisor.py) runs beside its child.

- `wait_until_full`: rank 0, after opening its gang, waits for the other ranks; a gang not full
  within the bound is released (the job back in the queue, no attempt spent) so that the machines
  already in it are not held for ever.
- `GangWatch`: every member heartbeats its seat every `interval_s`; a member whose seat no longer
  stands (the gang closed or released, another attempt, a cancel) is told at once, and rank 0 is
  told when any other member has been silent for a lease. `on_lost` is called once, with the reason;
  the supervisor then stops its child (and rank 0 ends the attempt once): every member stops within
  a lease of the first loss.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from shared.core.db import Database
from shared.jobs_repo import gangs
from shared.jobs_repo.gangs import Seat
from worker.fleet.health import DatabaseWatch

logger = logging.getLogger(__name__)


def wait_until_full(
    db: Database | DatabaseWatch,
    seat: Seat,
    *,
    bound_s: float,
    poll_s: float = 0.5,
    waiting: Callable[[], str | None] = lambda: None,
) -> bool:
    """Rank 0: whether its gang filled within `bound_s`; if not, the gang is released (False).
    `waiting` is called at every poll (the supervisor renews the job's lease there); a reason from
    it (a cancel, the worker's shutdown) ends the wait at once: the gang is closed and False is
    returned, the job left as it is for the caller to end."""
    deadline = time.monotonic() + bound_s
    while True:
        with db.session() as session:
            if gangs.gang_full(session, seat):
                return True
            if waiting() is not None:
                gangs.close_gang(session, seat)
                return False
            if time.monotonic() >= deadline:
                gangs.release_unfilled(session, seat=seat, waited_s=bound_s)
                return False
            gangs.beat(session, seat)  # rank 0 is alive while it waits: joiners look for that
        time.sleep(poll_s)


class GangWatch:
    """Heartbeats `seat` on a thread of its own and calls `on_lost(reason)` once when the attempt
    can no longer go on as one unit."""

    def __init__(
        self,
        db: Database | DatabaseWatch,
        seat: Seat,
        *,
        lease_s: float,
        interval_s: float,
        on_lost: Callable[[str], None],
    ) -> None:
        self._db, self._seat, self._lease_s, self._interval_s = db, seat, lease_s, interval_s
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gang-watch-{seat.job_id}", daemon=True)
        self.lost: str | None = None
        # Rank 0 only: whether the loss was another member's (stale, or left), not the attempt's end.
        self.member_lost = False
        self._beaten_at = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            reason = self._check()
            if reason is not None:
                self.lost = reason
                logger.warning("job %s: %s", self._seat.job_id, reason)
                self._on_lost(reason)
                return
            self._stop.wait(self._interval_s)

    def _check(self) -> str | None:
        seat = self._seat
        try:
            with self._db.session() as session:
                if not gangs.beat(session, seat):
                    return f"machine rank {seat.rank}: its gang's attempt {seat.attempt} has ended"
                if seat.rank == 0:
                    silent = gangs.stale_members(session, seat, lease_s=self._lease_s)
                    if silent:
                        self.member_lost = True
                        who = ", ".join(f"worker {worker} (machine rank {rank})" for rank, worker in silent)
                        return (
                            f"a machine of the gang was lost: {who} stopped or was silent for over "
                            f"{self._lease_s:g}s"
                        )
        except Exception as exc:  # the database away: the lease decides, as for a job's own lease
            logger.warning("job %s: gang heartbeat failed: %s", seat.job_id, exc)
            if time.monotonic() - self._beaten_at >= self._lease_s:
                return f"machine rank {seat.rank}: no heartbeat of its seat for a lease ({self._lease_s:g}s)"
            return None
        self._beaten_at = time.monotonic()
        return None
